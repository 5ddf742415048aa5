//! Take a lock, work under it while it is valid, release it.
//!
//! Start a local cluster in the repository with `cargo run --release -- dev`,
//! then:
//!
//! ```text
//! cargo run -p fencegate-client --example hold_lock [KEY]
//! ```
//!
//! KEY defaults to `rack/42`; the endpoints come from `$FENCEGATE_ENDPOINTS`
//! (comma-separated, default `http://127.0.0.1:7401`). Run two at once to see
//! the second one wait for the first.

use std::process::ExitCode;
use std::time::Duration;

use humantime::format_duration;

use fencegate_client::{AcquireOptions, Client, ClientError, Lease, DEFAULT_ENDPOINTS, TOKEN_HEADER};

const TTL: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(5);
const STEPS: u32 = 5;
const STEP: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("hold_lock: {msg}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let key = std::env::args().nth(1).unwrap_or_else(|| "rack/42".to_string());
    let endpoints: Vec<String> = std::env::var("FENCEGATE_ENDPOINTS")
        .unwrap_or_else(|_| DEFAULT_ENDPOINTS.join(","))
        .split(',')
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();

    let client = Client::new(endpoints.clone())
        .map_err(|e| format!("{e} (set $FENCEGATE_ENDPOINTS to http://host:port,...)"))?;
    let opts = AcquireOptions::new(TTL).wait(WAIT).holder(format!("hold_lock:{}", std::process::id()));
    let lease = client.acquire(&key, opts).await.map_err(|e| acquire_error(&key, &endpoints, e))?;
    println!("acquired {} with token {} (ttl {})", lease.key(), lease.token(), format_duration(lease.ttl()));

    let worked = tokio::select! {
        reason = lease.lost() => Err(format!("lease on {key} lost: {reason}; stopped before finishing")),
        result = work(&lease) => result,
    };
    if let Err(msg) = worked {
        // The token must not be used any more. Releasing is still worth a try:
        // if the service has the lease yet, the key is free sooner (it only
        // ever ends this lease, never a later holder's).
        let _ = lease.release().await;
        return Err(msg);
    }

    match lease.release().await {
        Ok(()) => {
            println!("released {key}");
            Ok(())
        }
        Err(ClientError::Unavailable(e)) => Err(format!(
            "release of {key} has an unknown outcome ({e}); the lease expires after {}",
            format_duration(TTL)
        )),
        Err(e) => Err(format!("release of {key} failed: {e}")),
    }
}

/// The simulated work: a few writes to the protected resource, each checked
/// against the lease's local validity first.
async fn work(lease: &Lease) -> Result<(), String> {
    for step in 1..=STEPS {
        if !lease.is_valid() {
            return Err(format!("lease on {} no longer valid before step {step}; stopping", lease.key()));
        }
        // A real program would send this header with its write, e.g. through the sidecar.
        println!(
            "step {step}/{STEPS}: PUT /{} with `{TOKEN_HEADER}: {}` ({} ms of validity left)",
            lease.key(),
            lease.token(),
            lease.remaining().as_millis()
        );
        tokio::time::sleep(STEP).await;
    }
    Ok(())
}

fn acquire_error(key: &str, endpoints: &[String], e: ClientError) -> String {
    match e {
        ClientError::Held { token, lock_delay: true, .. } => {
            format!("{key} is in lock-delay after the lease of token {token} expired; try again later")
        }
        e @ ClientError::Held { .. } => format!("{e}, and was not free within {}", format_duration(WAIT)),
        ClientError::Unavailable(e) => format!(
            "the lock service at {} did not answer in time ({e}); is `cargo run --release -- dev` running? \
             If {key} was granted after all, the lease expires after {}.",
            endpoints.join(","),
            format_duration(TTL)
        ),
        e => format!("could not acquire {key}: {e}"),
    }
}
