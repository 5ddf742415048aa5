//! `fencegate lock KEY -- CMD`: run a command while holding a lease, and stop
//! it the moment the lease may be lost. The lease is fencegate's, or, with
//! `--lock-service etcd`, etcd's (`Client::acquire_etcd`: the recipe of
//! `etcdctl lock`, the token its key's create revision).
//!
//! CMD runs in its own process group with `FENCE_KEY`, `FENCE_TOKEN`,
//! `FENCE_LEASE_ID` and `FENCE_OPERATION_ID` set. The client library keeps the lease alive; when its
//! `lost()` fires — the service said the lease is gone, or no keepalive was
//! acknowledged within the lease's conservative validity (L4) — the whole
//! group gets SIGTERM at once and SIGKILL after `--grace`. That is the point
//! of this command: `etcdctl lock` never stops the command on loss, and
//! `consul lock` stops it late.
//!
//! Exit status (`cli::exit`): CMD's own (128+signal if a signal ended it);
//! 75 when someone else holds the lock past `--wait`; 69 when the lock
//! service is unavailable; 76 when the lease was lost; 130/143 when
//! fencegate itself got Ctrl-C/SIGTERM.

use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use anyhow::Context;
use fencegate_client::{AcquireOptions, Client, ClientError, Lease};

use super::exit;

pub(super) struct LockArgs {
    pub key: String,
    pub ttl: Duration,
    pub wait: Duration,
    pub holder: Option<String>,
    pub grace: Duration,
    /// Exported to CMD as `FENCE_OPERATION_ID`, for its idempotency keys.
    pub operation_id: String,
    pub client: Client,
    /// Take etcd's lock (`Client::acquire_etcd`) rather than fencegate's.
    pub etcd: bool,
    pub command: Vec<String>,
}

pub(super) async fn run(args: LockArgs) -> anyhow::Result<i32> {
    crate::lock::validate::key(&args.key)?;
    let (program, rest) = args.command.split_first().ok_or_else(|| anyhow::anyhow!("no command given after --"))?;
    let client = args.client;
    let holder = args.holder.unwrap_or_else(default_holder);
    let opts = AcquireOptions::new(args.ttl).wait(args.wait).holder(holder);
    // Ours from before the acquire: a signal that came between the grant
    // and CMD's start would otherwise kill fencegate by its default action
    // and leave CMD running with nobody watching the lease.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let acquire = async {
        match args.etcd {
            true => client.acquire_etcd(&args.key, args.ttl, args.wait).await,
            false => client.acquire(&args.key, opts).await,
        }
    };
    let acquired = tokio::select! {
        acquired = acquire => acquired,
        // A grant in flight is not waited for: it expires after its TTL.
        _ = interrupt.recv() => return Ok(exit::INTERRUPTED),
        _ = terminate.recv() => return Ok(exit::TERMINATED),
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(e @ ClientError::Held { .. }) => {
            let wait = humantime::format_duration(args.wait);
            eprintln!("fencegate lock: {e}; not obtained (--wait {wait})");
            return Ok(exit::NOT_OBTAINED);
        }
        // Unavailable among them: `exit::for_error` gives it 69.
        Err(e) => return Err(e).with_context(|| format!("{} not obtained", args.key)),
    };
    if !lease.is_valid() {
        // Lost between the grant and now (this process paused): CMD must
        // not start on a lock someone else may hold.
        eprintln!("fencegate lock: lease on {} lost before {program} could start; not run", args.key);
        return Ok(exit::LEASE_LOST);
    }
    tracing::info!(key = %args.key, token = lease.token(), "lock acquired; running {program}");

    let mut command = Command::new(program);
    command
        .args(rest)
        // CMD gets the fencing token, not our credentials.
        .env_remove("FENCEGATE_TOKEN")
        .env("FENCE_KEY", &args.key)
        .env("FENCE_TOKEN", lease.token().to_string())
        .env("FENCE_LEASE_ID", lease.lease_id())
        .env("FENCE_OPERATION_ID", &args.operation_id)
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the hook makes one system call (prctl), which is
    // async-signal-safe, and allocates nothing. CMD gets SIGKILL if
    // fencegate itself dies (kill -9): nothing would watch its lease then.
    unsafe {
        command.pre_exec(|| nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)).map_err(std::io::Error::from));
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        // Nothing ran under the lock: give it back now, not after its TTL,
        // and say so as a shell would.
        Err(e) => {
            eprintln!("fencegate lock: cannot run {program}: {e}; lock on {} released", args.key);
            release(lease).await;
            return Ok(match e.kind() {
                std::io::ErrorKind::NotFound => exit::COMMAND_NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            });
        }
    };
    let group = Pid::from_raw(child.id().map(|id| id as i32).unwrap_or(0));

    // Biased: a loss that comes together with CMD's end or a signal is
    // reported as the loss (76), which is what the caller must act on.
    let code = tokio::select! {
        biased;
        reason = lease.lost() => {
            eprintln!("fencegate lock: lease on {} lost ({reason}); stopping {program}", args.key);
            stop(&mut child, group, args.grace).await;
            return Ok(exit::LEASE_LOST);
        }
        status = child.wait() => exit_code(status?),
        // As a shell reports a job ended by the signal, whatever CMD made of its SIGTERM.
        _ = interrupt.recv() => {
            stop(&mut child, group, args.grace).await;
            exit::INTERRUPTED
        }
        _ = terminate.recv() => {
            stop(&mut child, group, args.grace).await;
            exit::TERMINATED
        }
    };
    // Lost while CMD ended or was being stopped: CMD may have worked on
    // without the lock for a moment, so the caller hears of the loss.
    if !lease.is_valid() {
        eprintln!("fencegate lock: lease on {} lost while {program} ended", args.key);
        return Ok(exit::LEASE_LOST);
    }
    release(lease).await;
    Ok(code)
}

/// `host:pid`, which names the machine and the process in `fencegate status`.
fn default_holder() -> String {
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into());
    format!("{host}:{}", std::process::id())
}

/// SIGTERM to CMD's whole group now, SIGKILL after `grace`.
async fn stop(child: &mut Child, group: Pid, grace: Duration) -> Option<ExitStatus> {
    let _ = killpg(group, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            child.wait().await.ok()
        }
    }
}

async fn release(lease: Lease) {
    if let Err(e) = lease.release().await {
        eprintln!("fencegate lock: releasing the lease failed ({e}); it will expire after its TTL");
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
