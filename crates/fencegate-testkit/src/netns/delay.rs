//! Packet delay without `tc netem` (this kernel has none): an `iptables`
//! NFQUEUE rule in a member's namespace hands every packet of its `eth0`,
//! both ways, to a verdict loop on a thread of the test that entered that
//! namespace; the loop holds each packet for the delay and then accepts
//! it, in arrival order. The rule has `--queue-bypass`: with no loop bound,
//! packets pass.
//!
//! A delayed packet is held, not copied: TCP sees a slow link (its
//! retransmissions are held too), never a lost packet.

use std::collections::VecDeque;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::{enter_ns, Lab};

const QUEUE: u16 = 7;

/// A delay on one member's link; removed when dropped.
pub struct Delay {
    ns: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Delay {
    /// Hold every packet in and out of `name`'s `eth0` for `by`.
    pub fn start(lab: &Lab, name: &str, by: Duration) -> Delay {
        let ns = lab.member(name).ns.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = mpsc::channel();
        let (ns2, stop2) = (ns.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("delay-{name}"))
            .spawn(move || verdict_loop(&ns2, by, &stop2, ready_tx))
            .unwrap();
        ready.recv().unwrap().unwrap_or_else(|e| panic!("NFQUEUE in {ns}: {e}"));
        for (chain, dir) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            iptables(
                &ns,
                &["-A", chain, dir, "eth0", "-j", "NFQUEUE", "--queue-num", &QUEUE.to_string(), "--queue-bypass"],
            );
        }
        Delay { ns, stop, thread: Some(thread) }
    }

    /// Remove the rules, release what is held; how many packets were delayed.
    pub fn stop(mut self) -> u64 {
        self.end()
    }

    fn end(&mut self) -> u64 {
        let Some(thread) = self.thread.take() else { return 0 };
        for chain in ["INPUT", "OUTPUT"] {
            iptables(&self.ns, &["-F", chain]);
        }
        self.stop.store(true, Ordering::SeqCst);
        thread.join().unwrap_or(0)
    }
}

impl Drop for Delay {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.end();
        } else if let Some(t) = self.thread.take() {
            // The namespace goes with the lab; just let the loop go.
            self.stop.store(true, Ordering::SeqCst);
            let _ = t.join();
        }
    }
}

fn iptables(ns: &str, args: &[&str]) {
    let out = Command::new("ip").args(["netns", "exec", ns, "iptables", "-w"]).args(args).output().expect("iptables");
    assert!(out.status.success(), "iptables {args:?} in {ns}: {}", String::from_utf8_lossy(&out.stderr));
}

fn verdict_loop(ns: &str, by: Duration, stop: &AtomicBool, ready: mpsc::Sender<std::io::Result<()>>) -> u64 {
    enter_ns(ns);
    let open = || -> std::io::Result<nfq::Queue> {
        let mut q = nfq::Queue::open()?;
        q.bind(QUEUE)?;
        // A full queue lets packets through rather than dropping them.
        q.set_fail_open(QUEUE, true)?;
        q.set_queue_max_len(QUEUE, 65_536)?;
        q.set_nonblocking(true);
        Ok(q)
    };
    let mut q = match open() {
        Ok(q) => {
            let _ = ready.send(Ok(()));
            q
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return 0;
        }
    };
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    let mut count = 0u64;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        loop {
            match q.recv() {
                Ok(mut msg) => {
                    count += 1;
                    msg.set_verdict(nfq::Verdict::Accept);
                    held.push_back((Instant::now() + by, msg));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("delay in {ns}: recv: {e}");
                    break;
                }
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| stopping || *due <= now) {
            let (_, msg) = held.pop_front().unwrap();
            if let Err(e) = q.verdict(msg) {
                eprintln!("delay in {ns}: verdict: {e}");
            }
        }
        if stopping && held.is_empty() {
            let _ = q.unbind(QUEUE);
            return count;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
