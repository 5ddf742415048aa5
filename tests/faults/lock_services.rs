//! What the suites of the lock services other than fencegate's (etcd,
//! ZooKeeper) share: a refusal's reason, and what they check once the
//! service is gone (nothing more is forwarded, and a sidecar restarted then
//! keeps its floors).

use std::time::Duration;

use fencegate_testkit::{Sidecar, Upstream};
use serde_json::Value;

/// A refusal's `error`.
pub(crate) fn error_of(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

/// With the service just killed: `sc` says it is down and refuses what
/// needs the service's word (a lock it knows nothing of) with 503;
/// restarted (SIGKILL) with the service still gone, it keeps its floors on
/// `path` (whose lock A held with `ta`, then B with `tb`, both forwarded):
/// A's token is below B's, which it forwarded, and is refused without the
/// service; B's needs the service's word.
pub(crate) async fn floors_outlive_the_service(sc: &mut Sidecar, up: &Upstream, path: &str, (ta, tb): (u64, u64)) {
    sc.wait_for_metric("fencegate_sidecar_lock_service_up", 0.0, Duration::from_secs(10)).await;
    let (status, v) = sc.send("PUT", "/racks/unknown", Some(tb), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    sc.restart().await;
    let (status, v) = sc.send("PUT", path, Some(ta), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(tb)), "{v}");
    let (status, v) = sc.send("PUT", path, Some(tb), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    assert_eq!(up.tokens(path), vec![Some(ta), Some(tb)]);
}
