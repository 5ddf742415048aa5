//! A TCP relay for one directed link (a node's requests to a peer, or a
//! sidecar's to the lock service), which a test can cut (drop live
//! connections and refuse new ones) and heal, and which can hold back what
//! comes back by a fixed delay.
//!
//! A cut is loud: both ends see their connection close. A *black hole*
//! ([`Relay::set_black_hole`]) is silent, as a partition is: live
//! connections stay open but nothing passes either way, no FIN and no RST,
//! and new connections are accepted and then hear nothing. Only timeouts
//! tell the ends. Connections black-holed stay dead when it lifts (their
//! ends have given up on them by then); new ones pass again.

use std::time::Duration;

use tokio::io::{copy, copy_bidirectional, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub struct Relay {
    pub port: u16,
    cut: watch::Sender<bool>,
    hole: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// A relay on a free port to 127.0.0.1:`target_port`.
    pub async fn start(target_port: u16) -> Relay {
        Self::with_delay(target_port, Duration::ZERO).await
    }

    /// A relay whose answers (bytes from the target back to the client)
    /// arrive `delay` late, in order; requests pass at once.
    pub async fn with_delay(target_port: u16, delay: Duration) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = watch::Sender::new(false);
        let hole = watch::Sender::new(false);
        let task = tokio::spawn(accept(listener, target_port, cut.subscribe(), hole.subscribe(), delay));
        Relay { port, cut, hole, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    /// Drop everything silently (see the module's comment), or stop.
    pub fn set_black_hole(&self, on: bool) {
        self.hole.send_replace(on);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target_port: u16,
    cut: watch::Receiver<bool>,
    hole: watch::Receiver<bool>,
    delay: Duration,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if *cut.borrow() {
            continue; // dropped: the connection is reset
        }
        let (mut cut, mut hole) = (cut.clone(), hole.clone());
        tokio::spawn(async move {
            let holed = *hole.borrow();
            if holed {
                // Accepted, then silence: held open until a cut or the end.
                let _ = cut.wait_for(|c| *c).await;
                drop(inbound);
                return;
            }
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target_port)).await else { return };
            let (mut inbound, mut outbound) = (inbound, outbound);
            tokio::select! {
                _ = pipe(&mut inbound, &mut outbound, delay) => {}
                // (Mapped to `()`: the guard `wait_for` answers is not `Send`,
                // and a branch's output lives while another's body runs.)
                () = async { let _ = cut.wait_for(|c| *c).await; } => {}
                () = async { let _ = hole.wait_for(|h| *h).await; } => {
                    // Nothing passes any more, and nobody is told: both
                    // sockets stay open until a cut or the relay's end.
                    let _ = cut.wait_for(|c| *c).await;
                }
            }
        });
    }
}

/// Both directions until both sides are done, each side's end passed on
/// (so that a client learns at once that the target went away); what comes
/// back from `outbound` is held for `delay`.
async fn pipe(inbound: &mut TcpStream, outbound: &mut TcpStream, delay: Duration) {
    if delay.is_zero() {
        let _ = copy_bidirectional(inbound, outbound).await;
        return;
    }
    let (mut in_read, mut in_write) = inbound.split();
    let (mut out_read, mut out_write) = outbound.split();
    let requests = async {
        let _ = copy(&mut in_read, &mut out_write).await;
        let _ = out_write.shutdown().await;
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let answers = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = out_read.read(&mut buf).await {
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let held_back = async {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if in_write.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = in_write.shutdown().await;
    };
    tokio::join!(requests, answers, held_back);
}
