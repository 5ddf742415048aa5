//! S1/S2 under concurrency: many holders and stale "zombie" writers on a few
//! keys, random delays at the upstream, real grants. Whatever the
//! interleaving, each key's writes reach the upstream in non-decreasing token
//! order and never below a grant the sidecar had learnt.
//! Bounded: a fixed seed, a fixed number of rounds, a deadline.

use std::sync::Arc;
use std::time::Duration;

use fencegate_client::AcquireOptions;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, http, Cluster, Upstream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::watch;

const KEYS: usize = 3;
const HOLDERS_PER_KEY: usize = 3;
const ROUNDS: usize = 4;
const SEED: u64 = 0x5eed_f00d;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_the_upstream_in_token_order_under_concurrency() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Arc::new(Upstream::start().await);
    // More event loops than cores: requests on one key arrive on several
    // loops, which share one set of permits and floors.
    let routes =
        format!("workers: 4\n{}", table(&[rack_writes("{ mode: monotonic }").methods(&["PUT"]), everything_else()]));
    let sc = Arc::new(c.sidecar("sc", &up.url(), &routes).await);
    let client = c.client();
    // Every token ever granted per key, for the zombies to replay (a watch,
    // so that a zombie waits for the second grant instead of spending its
    // turns), and how many of the key's holders are done.
    let granted: Arc<Vec<watch::Sender<Vec<u64>>>> = Arc::new((0..KEYS).map(|_| watch::Sender::new(vec![])).collect());
    let done: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let (mut tasks, mut zombies) = (vec![], vec![]);
    for key in 0..KEYS {
        for holder in 0..HOLDERS_PER_KEY {
            let (client, sc, granted, up, done) =
                (client.clone(), sc.clone(), granted.clone(), up.clone(), done.clone());
            let mut rng = StdRng::seed_from_u64(SEED ^ (key * 100 + holder) as u64);
            tasks.push(tokio::spawn(async move {
                let mut in_flight = vec![];
                for round in 0..ROUNDS {
                    let opts = AcquireOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(20));
                    let lease = client.acquire(&format!("rack/{key}"), opts).await.unwrap();
                    let token = lease.token();
                    granted[key].send_modify(|g| g.push(token));
                    for _ in 0..2 {
                        let delay = rng.random_range(0..30u64).to_string();
                        let (status, _) =
                            sc.send("PUT", &format!("/racks/{key}"), Some(token), &[("x-test-delay-ms", &delay)]).await;
                        assert_eq!(status, 200, "the holder's own write was refused");
                    }
                    // The last write is still at the (slow) upstream when the
                    // lease is released and the next holder starts writing.
                    let (sc2, delay) = (sc.clone(), rng.random_range(50..150u64).to_string());
                    let id = format!("{key}/{holder}/{round}");
                    let tag = id.clone();
                    in_flight.push(tokio::spawn(async move {
                        let headers = [("x-test-delay-ms", delay.as_str()), ("x-test-id", tag.as_str())];
                        sc2.send("PUT", &format!("/racks/{key}"), Some(token), &headers).await.0
                    }));
                    // Released once that write has reached the upstream (it may
                    // first wait for slower lower-token writes to complete).
                    up.wait_for_arrival(Duration::from_secs(10), |a| {
                        a.headers.get("x-test-id").is_some_and(|v| v == id.as_str())
                    })
                    .await;
                    lease.release().await.unwrap();
                }
                done[key].fetch_add(1, Ordering::SeqCst);
                for w in in_flight {
                    // Forwarded, or refused because a newer holder had
                    // already been learnt of: never out of order.
                    assert!(matches!(w.await.unwrap(), 200 | 409));
                }
            }));
        }
        // A zombie replays old tokens of this key while its holders work:
        // from the key's second grant until its last holder is done.
        let (sc, granted, done) = (sc.clone(), granted.clone(), done.clone());
        let mut rng = StdRng::seed_from_u64(SEED ^ key as u64);
        zombies.push(tokio::spawn(async move {
            let mut refused = 0;
            granted[key].subscribe().wait_for(|g| g.len() >= 2).await.unwrap();
            while done[key].load(Ordering::SeqCst) < HOLDERS_PER_KEY {
                tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
                let old = {
                    let g = granted[key].borrow();
                    g[rng.random_range(0..g.len() - 1)]
                };
                let delay = rng.random_range(0..60u64).to_string();
                let (status, _) =
                    sc.send("PUT", &format!("/racks/{key}"), Some(old), &[("x-test-delay-ms", &delay)]).await;
                if status == 409 {
                    refused += 1;
                }
            }
            refused
        }));
    }
    let mut refused = vec![];
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
        for z in zombies {
            refused.push(z.await.unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all).await.expect("workload did not finish in time");

    for key in 0..KEYS {
        let tokens: Vec<u64> = up.tokens(&format!("/racks/{key}")).into_iter().map(Option::unwrap).collect();
        assert!(!tokens.is_empty());
        for pair in tokens.windows(2) {
            assert!(pair[0] <= pair[1], "key {key}: the upstream received {} after {}: {tokens:?}", pair[1], pair[0]);
        }
        let last_grant = *granted[key].borrow().iter().max().unwrap();
        assert_eq!(*tokens.last().unwrap(), last_grant, "key {key}: the last holder's writes are the last applied");
    }
    for (key, refused) in refused.iter().enumerate() {
        assert!(*refused > 0, "key {key}: its zombie was never refused: the check did not run ({refused:?})");
    }
}

/// The checker above must be able to fail: the same kind of workload sent
/// straight to the upstream produces out-of-order writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_checker_fails_without_the_sidecar() {
    let up = Arc::new(Upstream::start().await);
    let url = format!("{}/racks/x", up.url());
    // The paused writer (token 1) sends only once the newer write (token 2) took effect.
    let (u, paused_url) = (up.clone(), url.clone());
    let paused = tokio::spawn(async move {
        u.wait_for_applied(1, Duration::from_secs(5)).await;
        http::send(http::fenced_put(paused_url, 1), Duration::from_secs(5)).await
    });
    assert_eq!(http::send(http::fenced_put(&url, 2), Duration::from_secs(5)).await.0, 200);
    assert_eq!(paused.await.unwrap().0, 200);
    let tokens = up.tokens("/racks/x");
    assert_eq!(tokens, vec![Some(2), Some(1)], "a paused writer's late write lands after the newer one");
}
