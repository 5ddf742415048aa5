//! A private network of Linux network namespaces, made and unmade by the
//! test: a hub namespace holding a bridge, and one namespace per member
//! (a node, the sidecar, the workers, the test's own controller), each
//! joined to the bridge by a veth pair and given its own address on
//! 10.77.0.0/24. Faults are firewall rules inside a member's namespace
//! ([`Lab::set_rules`], nftables; silent drops, so connections go
//! half-open) and packet delay ([`delay`], an NFQUEUE verdict loop).
//!
//! Nothing is made or changed in the root namespace: every link and
//! address is created with `ip -n NS`, straight inside its namespace.
//! Namespaces are named `fgnet<pid>-<lab>-<member>`: removed when the [`Lab`] is
//! dropped (also on a panic), by a SIGINT/SIGTERM handler before the test
//! process exits, and, for a run killed with SIGKILL, by the next `Lab`'s
//! sweep of every `fgnet<pid>-…` whose pid is dead.
//!
//! Needs root, `ip` (iproute2), `nft` (nftables) and `iptables` (for the
//! NFQUEUE rule: this kernel's nftables has no native `queue`). Without
//! them [`preflight`] fails the test.

pub mod delay;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

/// The prefix every namespace of every lab starts with.
pub const PREFIX: &str = "fgnet";

/// Every namespace a live lab of this process made: what the signal
/// handler removes.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Panics (the test fails) if namespaces cannot be made here: this is the
/// fault tier, where a missing privilege or tool is a failure, never a skip.
pub fn preflight() {
    if let Some(why) = missing() {
        panic!("{why} (CI installs what the partition suite needs: .ci/partitions)");
    }
}

fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables"), ("iptables", "iptables")] {
        let found = Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !matches!(found, Ok(s) if s.success()) {
            return Some(format!("`{tool}` is missing (Debian package {package})"));
        }
    }
    None
}

/// A member of the lab: its namespace and address.
#[derive(Debug, Clone)]
pub struct Member {
    pub ns: String,
    pub addr: Ipv4Addr,
}

/// The namespaces of one test; removed when dropped.
pub struct Lab {
    hub: String,
    members: BTreeMap<String, Member>,
}

impl Lab {
    /// The hub and one namespace per name, each at 10.77.0.(10 + its
    /// position), all up and reaching each other through the hub's bridge.
    pub fn new(names: &[&str]) -> Lab {
        on_signal_remove_namespaces();
        sweep();
        // Unique per lab: tests of one binary run side by side.
        static LABS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tag = format!("{PREFIX}{}-{}", std::process::id(), LABS.fetch_add(1, Ordering::SeqCst));
        let hub = format!("{tag}-hub");
        let mut lab = Lab { hub: hub.clone(), members: BTreeMap::new() };
        lab.add_ns(&hub);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{tag}-{name}");
            let addr = Ipv4Addr::new(10, 77, 0, 10 + i as u8);
            lab.add_ns(&ns);
            let port = format!("v{i}");
            // Both ends are born in namespaces of the lab, never in the root one.
            ip(&["-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            lab.members.insert(name.to_string(), Member { ns, addr });
        }
        lab
    }

    fn add_ns(&mut self, ns: &str) {
        ip(&["netns", "add", ns]);
        LIVE.lock().unwrap().push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }

    pub fn member(&self, name: &str) -> &Member {
        self.members.get(name).unwrap_or_else(|| panic!("no member {name} in the lab"))
    }

    pub fn addr(&self, name: &str) -> Ipv4Addr {
        self.member(name).addr
    }

    /// Every member's namespace name, by member.
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.hub.clone()).chain(self.members.values().map(|m| m.ns.clone())).collect()
    }

    /// `program args…` run inside `name`'s namespace (`ip netns exec`,
    /// which execs it: the pid is the program's own).
    pub fn command(&self, name: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.member(name).ns]).arg(program);
        cmd
    }

    /// Move the calling thread into `name`'s namespace: every socket it
    /// creates from now on is there (a socket keeps the namespace it was
    /// made in). For a runtime's threads: `on_thread_start`.
    pub fn enter(&self, name: &str) {
        enter_ns(&self.member(name).ns);
    }

    /// Replace the firewall of `name`'s namespace by `rules` (nftables
    /// statements, one per line, for its `input` and `output` chains),
    /// atomically; empty `rules` remove it.
    pub fn set_rules(&self, name: &str, rules: &Rules) {
        let ns = &self.member(name).ns;
        let script = format!(
            "table inet fencegate {{}}\ndelete table inet fencegate\n{}",
            if rules.is_empty() { String::new() } else { rules.table() }
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nft");
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "nft in {ns}: {}\n{script}", String::from_utf8_lossy(&out.stderr));
    }

    /// Kill whatever still runs in the lab's namespaces (only this test's
    /// processes live there) and remove them.
    fn remove(&mut self) {
        for ns in self.namespaces() {
            remove_ns(&ns);
            LIVE.lock().unwrap().retain(|n| *n != ns);
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Firewall rules of one namespace: silent drops (never REJECT: the peer
/// sees nothing, connections go half-open) on its `eth0`.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    input: Vec<String>,
    output: Vec<String>,
}

impl Rules {
    pub fn is_empty(&self) -> bool {
        self.input.is_empty() && self.output.is_empty()
    }

    /// Drop what `from` sends here.
    pub fn drop_from(mut self, from: Ipv4Addr) -> Rules {
        self.input.push(format!("ip saddr {from} drop"));
        self
    }

    /// Drop what this namespace sends to `to`.
    pub fn drop_to(mut self, to: Ipv4Addr) -> Rules {
        self.output.push(format!("ip daddr {to} drop"));
        self
    }

    /// Drop both ways between here and `other`.
    pub fn cut(self, other: Ipv4Addr) -> Rules {
        self.drop_from(other).drop_to(other)
    }

    /// Drop `percent` % of the packets coming in and going out, at random.
    pub fn loss(mut self, percent: u8) -> Rules {
        // numgen's values are 0–99: 100 % is every packet.
        let share = if percent >= 100 { String::new() } else { format!("numgen random mod 100 < {percent} ") };
        self.input.push(format!("iifname \"eth0\" {share}drop"));
        self.output.push(format!("oifname \"eth0\" {share}drop"));
        self
    }

    fn table(&self) -> String {
        let chain = |name: &str, hook: &str, rules: &[String]| {
            format!(
                "  chain {name} {{\n    type filter hook {hook} priority 0; policy accept;\n{}  }}\n",
                rules.iter().map(|r| format!("    {r}\n")).collect::<String>()
            )
        };
        format!(
            "table inet fencegate {{\n{}{}}}\n",
            chain("input", "input", &self.input),
            chain("output", "output", &self.output)
        )
    }
}

/// The calling thread into the named namespace.
pub fn enter_ns(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
    // SAFETY: setns on a valid descriptor of a network namespace only
    // changes this thread's namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// CLOCK_MONOTONIC in nanoseconds: the clock std's and tokio's `Instant`
/// read, shared by every process of the machine (so a worker process can
/// stamp its history on the test's timeline).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

fn remove_ns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
}

/// Remove the namespaces of labs whose process is gone (a run killed with
/// SIGKILL cannot clean up after itself). Their processes died with it
/// (the kit's children get SIGKILL when the test process dies).
pub fn sweep() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        }
    }
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// On SIGINT or SIGTERM (Ctrl-C of the test), remove every live lab's
/// namespaces, then exit as the signal would have (the kit's children die
/// with the process). The handler only notes the signal; a thread does the
/// work (nothing else is safe in a signal handler).
fn on_signal_remove_namespaces() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            unsafe { libc::signal(sig, note_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        }
        std::thread::Builder::new()
            .name("netns-cleanup".into())
            .spawn(|| loop {
                let sig = SIGNALLED.load(Ordering::SeqCst);
                if sig != 0 {
                    let live: Vec<String> = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
                    eprintln!("signal {sig}: removing the lab's namespaces {live:?}");
                    for ns in live {
                        remove_ns(&ns);
                    }
                    std::process::exit(128 + sig);
                }
                std::thread::sleep(Duration::from_millis(50));
            })
            .unwrap();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_an_nftables_table_of_silent_drops() {
        let a = Ipv4Addr::new(10, 77, 0, 11);
        let t = Rules::default().cut(a).loss(30).table();
        assert!(t.contains("ip saddr 10.77.0.11 drop"), "{t}");
        assert!(t.contains("ip daddr 10.77.0.11 drop"), "{t}");
        assert!(t.contains("numgen random mod 100 < 30 drop"), "{t}");
        assert!(!t.contains("reject"), "{t}");
    }
}
