//! Bounded waits: poll a condition until it holds, and fail the test saying
//! what did not happen if it does not within the bound.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(20);

/// Until `check()` is `Ok`; its value. Panics naming `what`, with the last
/// `Err`, after `within`; a `check` that hangs counts against the bound too.
pub async fn until_ok<T, E, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    loop {
        let last = match tokio::time::timeout_at(deadline, check()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) => format!("{e:?}"),
            Err(_) => "(the check itself did not finish)".to_string(),
        };
        assert!(Instant::now() < deadline, "{what}: not within {within:?}; last: {last}");
        tokio::time::sleep(POLL).await;
    }
}

/// Until `check()` is true.
pub async fn until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    until_ok(what, within, || {
        let f = check();
        async move {
            if f.await {
                Ok(())
            } else {
                Err("false")
            }
        }
    })
    .await
}
