//! Command-line interface (docs/DESIGN.md "CLI"). Each subcommand lives in its own
//! file; this one parses and dispatches, and owns the exit codes.

// First: its `println!`, `print!` and `eprintln!` are the ones every
// module below uses.
#[macro_use]
mod out;
mod demo;
mod dev;
pub(crate) mod exit;
mod healthcheck;
mod idempotency;
mod inventory;
mod local_etcd;
mod lock;
mod logging;
mod server;
mod sidecar;
mod snapshot;
mod stack;
mod status;
mod token;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::ConfigError;
use crate::config::ConfigFile;

/// Distributed locks with fencing tokens, and a sidecar that enforces them.
#[derive(Debug, Parser)]
#[command(name = "fencegate", version, about, long_about = None, after_long_help = GLOBAL)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr: text or json.
    #[arg(
        long,
        global = true,
        value_enum,
        hide_possible_values = true,
        default_value = "text",
        env = "FENCEGATE_LOG_FORMAT"
    )]
    log_format: logging::LogFormat,
    /// Log INFO lines too (one-shot commands: warnings only by default).
    #[arg(long, short, global = true)]
    verbose: bool,
}

/// The global flags and the connection options, said once (in `fencegate
/// --help`) rather than in every subcommand's help: a subcommand gives each
/// a line.
const GLOBAL: &str = "\
Logs go to stderr: --log-format text (one line per event, for a person;
colour only on a terminal, and not with NO_COLOR set) or json (one object
per line: timestamp, level, target, fields; for a log shipper). Filter them
with FENCEGATE_LOG (else RUST_LOG), e.g. `debug` or
`info,fencegate::sidecar=debug`. `lock`, `status` and the other one-shot
commands log only warnings by default (-v: INFO too); `server`, `sidecar`
and `inventory` log INFO.

Connection options, before or after the subcommand: --endpoints lists node
URLs; any node will do, followers forward to the leader, and a node that
does not answer is skipped. The default is the three nodes of `fencegate
dev` and config/node{1,2,3}.yaml, but never with --token over plain HTTP: a
token goes only where you say. --ca speaks HTTPS (the endpoints must then
be https://) and trusts only that CA; --cert and --key add a client
certificate. --token is for nodes with `auth.tokens_file`; prefer
FENCEGATE_TOKEN, as a command line is visible to every user of the machine.";

/// What `lock --help` says after the options (and `lock -h` too).
const LOCK: &str = "\
CMD gets FENCE_KEY, FENCE_TOKEN, FENCE_LEASE_ID and FENCE_OPERATION_ID in its
environment (send \"Idempotency-Key: $FENCE_OPERATION_ID-STEP\" with each
write, and a retried write is applied once).

Exit status:
  CMD's own  CMD exited (128 + N if signal N ended it)
  75         someone else holds KEY, not obtained within --wait
  69         the lock service is unavailable (no node answered, no quorum)
  76         the lease was lost (CMD got SIGTERM at once, SIGKILL after --grace)
  130, 143   Ctrl-C (SIGINT), SIGTERM to fencegate: CMD stopped, lease released
  1          other errors (an invalid key, refused credentials)";

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one lock service node (a 3- or 5-node Raft cluster shares one `peers` list).
    ///
    /// Exit status: 0 after Ctrl-C or SIGTERM (drained); 64 for a bad config
    /// file; 69 if `listen` or `peer_listen` is taken (nothing is created
    /// under data_dir first); 70 if the Raft core stopped or a task panicked.
    Server {
        /// Node configuration (YAML): id, listen, data_dir, peers, lease, raft.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run the fencing reverse proxy in front of an HTTP API.
    ///
    /// Exit status: 0 after Ctrl-C or SIGTERM (drained); 64 for a bad config
    /// file or TLS file; 69 if `listen` or `metrics_listen` is taken (nothing
    /// is created under state_dir first).
    Sidecar {
        /// Sidecar configuration (YAML): listen, upstream, lock_service, state_dir, routes.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run CMD while holding KEY; stop it the moment the lease may be lost.
    #[command(after_help = LOCK)]
    Lock {
        /// The lock key, e.g. rack/42.
        #[arg(value_parser = lock_key)]
        key: String,
        /// Lease TTL: how long the service keeps the lease without keepalives.
        #[arg(long, default_value = "30s", value_parser = ttl)]
        ttl: std::time::Duration,
        /// How long to wait for the lock if someone else holds it.
        #[arg(long, default_value = "0s", value_parser = wait)]
        wait: std::time::Duration,
        /// Who is holding it, shown by `fencegate status KEY` (default: host:pid).
        #[arg(long, value_parser = holder)]
        holder: Option<String>,
        /// Time between SIGTERM and SIGKILL when CMD must stop.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        grace: std::time::Duration,
        /// Exported as FENCE_OPERATION_ID, for CMD's idempotency keys [default: random].
        #[arg(long, env = "FENCEGATE_OPERATION_ID", value_parser = operation_id)]
        operation_id: Option<String>,
        /// Whose lock: fencegate's, or etcd's (`etcdctl lock`'s recipe; endpoints
        /// default to http://127.0.0.1:2379; FENCE_TOKEN is the key's create revision).
        #[arg(long, value_enum, default_value = "fencegate")]
        lock_service: LockService,
        #[command(flatten)]
        endpoints: Endpoints,
        /// The command to run, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show the cluster (leader, term, members, commit index), or one key.
    ///
    /// Exit status: 0; 69 if the lock service is unavailable; 1 for other errors.
    Status {
        /// A lock key, e.g. rack/42. Without it, the cluster is shown.
        #[arg(value_parser = lock_key)]
        key: Option<String>,
        /// Print the Lock API's answer as one JSON object instead: that of
        /// GET /v1/cluster, or of GET /v1/locks/KEY (docs/DESIGN.md "CLI").
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Everything on one machine: lock nodes on 127.0.0.1:7401–7403, the sidecar on
    /// :8080 (metrics :9464) in front of the built-in inventory API on :9000.
    Dev {
        /// Where the nodes keep their data (kept between runs).
        #[arg(long, default_value = "./data/dev")]
        data: PathBuf,
        /// Wipe the data directory first.
        #[arg(long)]
        fresh: bool,
        /// Listen on ports the OS picks instead of the well-known ones (the
        /// banner shows them), for when those are taken. A second `dev` also
        /// needs its own --data.
        #[arg(long)]
        free_ports: bool,
        /// Whose lock service: three fencegate nodes, or a one-member etcd
        /// (`etcd` on PATH, started on 2379/2380) that the sidecar fences.
        #[arg(long, value_enum, default_value = "fencegate")]
        lock_service: LockService,
    },
    /// Replay the pause problem on real components, with and without the sidecar.
    Demo {
        /// A's lease TTL.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// How long A pauses (must be longer than --ttl).
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        pause: std::time::Duration,
        /// Also write the run as a Mermaid sequence diagram to this file.
        #[arg(long)]
        mermaid: Option<PathBuf>,
        /// Whose locks A and B take: fencegate's, or etcd's (`etcdctl lock`'s
        /// recipe; without --endpoints, a one-member etcd from PATH is started).
        #[arg(long, value_enum, default_value = "fencegate")]
        lock_service: LockService,
        /// Replay it on a running lock service (comma-separated node URLs)
        /// instead of starting one; needs --sidecar and --inventory.
        #[arg(long, value_delimiter = ',', requires_all = ["sidecar", "inventory"])]
        endpoints: Option<Vec<String>>,
        /// The running sidecar's URL, in front of --inventory.
        #[arg(long, requires = "endpoints")]
        sidecar: Option<String>,
        /// The running inventory API's URL (`fencegate inventory`).
        #[arg(long, requires = "endpoints")]
        inventory: Option<String>,
    },
    /// Serve the demo's legacy inventory API on its own (it checks no
    /// tokens; `dev` runs it built in), e.g. in a container behind a sidecar.
    Inventory {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: std::net::SocketAddr,
    },
    /// List, add or remove lock-service members, online (needs the admin
    /// right on every key once ACLs are on).
    ///
    /// A new node is started first with its own config (its `peers` listing
    /// the current members and itself), then added: it joins as a learner,
    /// catches up, and only then votes. No other node's config changes. A
    /// change that would leave the voters without a live majority is
    /// refused unless --force. Removing the leader hands leadership over
    /// first. Exit status 1 if the cluster refused, 69 if it is unavailable.
    Member {
        #[command(subcommand)]
        action: MemberAction,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Back up the lock table, check a backup, or restore one into a new cluster.
    ///
    /// A restored cluster is a new history (a new cluster id) whose tokens
    /// start at the restoring host's clock in microseconds: above every
    /// token the lost cluster granted, also after the backup was taken, with
    /// no guess from the operator. No lease of the backup is live after the
    /// restore.
    Snapshot {
        #[command(subcommand)]
        action: SnapshotAction,
    },
    /// Make a bearer token for a client identity: prints the token, then the
    /// line for the nodes' `auth.tokens_file` (which stores only its hash).
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Look at, or settle, an idempotency key's record on a running sidecar.
    ///
    /// A request whose outcome is unknown (the exchange broke after it may
    /// have reached the upstream, or the sidecar died in between) is never
    /// forwarded again by itself: find out at the upstream whether it was
    /// applied, then say so here. Exit status 1 if the sidecar refused, 69 if it did not answer.
    Idempotency {
        #[command(subcommand)]
        action: IdempotencyAction,
    },
    /// GET a health URL (a container's HEALTHCHECK): exit 0 on a 2xx
    /// answer, 1 otherwise with what failed on stderr.
    ///
    /// Point it at the process's own port: a node's `listen` (/healthz,
    /// /readyz), a sidecar's `metrics_listen` (/healthz, /readyz).
    Healthcheck {
        /// The URL to GET.
        #[arg(env = "FENCEGATE_HEALTH_URL", default_value = healthcheck::DEFAULT_URL)]
        url: String,
        /// How long to wait for the whole answer.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// For an https:// URL: PEM file of the CA that signed the node's
        /// certificate (nothing else is trusted).
        #[arg(long, value_name = "PEM")]
        ca: Option<PathBuf>,
    },
    /// Validate a configuration file without starting anything (exit 64 if bad).
    CheckConfig {
        /// A node or sidecar configuration file (a file with `routes` is a sidecar's).
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum MemberAction {
    /// The members as the leader sees them: role, URL, replication, whether each answers.
    List,
    /// Add node ID, whose peer plane is at PEER_URL (its `peer_listen`).
    Add {
        id: u64,
        peer_url: String,
        /// Its Lock API URL (its `listen`), told to clients.
        #[arg(long)]
        client_url: Option<String>,
        /// Add it even if the new voters would have no live majority.
        #[arg(long)]
        force: bool,
    },
    /// Remove node ID (a dead one, or one being retired).
    Remove {
        id: u64,
        /// Remove it even if the remaining voters would have no live majority.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotAction {
    /// Save the leader's table to FILE, with a checksum. Consistent: every
    /// grant acknowledged before the call is in it. Needs the admin right
    /// on every key; the file names holders and owners, so keep it as
    /// private as the nodes' data.
    Save {
        file: PathBuf,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Check FILE's checksum and print what it holds (its revision, keys, leases, when it was taken).
    Inspect { file: PathBuf },
    /// Build the data directory of a new cluster's first node from FILE.
    ///
    /// Give the config of the node with the smallest id of the new
    /// cluster's `peers`, whose data_dir holds no node's data. Start it,
    /// then the other nodes with empty data directories: they receive the
    /// table from it. No lease, lock-delay or request id of the backup
    /// survives, and every token up to the restore reads as ended.
    Restore {
        file: PathBuf,
        /// The new cluster's first node.
        #[arg(long, short)]
        config: PathBuf,
        /// An extra floor: the restored cluster grants only tokens above
        /// this and above this host's clock in microseconds since 1970
        /// (which alone is above every token a lost cluster can have
        /// granted, unless its tokens were set above the clock by an
        /// earlier --min-token). Not needed; the clock must be right.
        #[arg(long, default_value_t = 0)]
        min_token: u64,
    },
}

#[derive(Debug, Subcommand)]
enum IdempotencyAction {
    /// Print the record of KEY under LOCK_KEY (state, token, times, status), as JSON.
    Show {
        #[command(flatten)]
        record: IdempotencyRecord,
        /// On a refusal (no such record), print the sidecar's JSON answer on
        /// stdout instead of a sentence on stderr.
        #[arg(long)]
        json: bool,
    },
    /// Settle an unknown outcome: --applied STATUS (retries get STATUS with
    /// an empty body) or --not-applied (the next retry is forwarded).
    Resolve {
        #[command(flatten)]
        record: IdempotencyRecord,
        /// It was applied; retries get this status.
        #[arg(long, conflicts_with = "not_applied", required_unless_present = "not_applied")]
        applied: Option<u16>,
        /// It was not applied; the next request with the key is forwarded.
        #[arg(long)]
        not_applied: bool,
    },
}

#[derive(Debug, clap::Args)]
struct IdempotencyRecord {
    /// The sidecar's metrics listener (loopback only), e.g. http://127.0.0.1:9464.
    #[arg(long)]
    sidecar: String,
    /// The admin token the sidecar made on first start: STATE_DIR/admin-token.
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// The lock key the request wrote under, e.g. rack/42.
    #[arg(long)]
    lock_key: String,
    /// The fencing token the request carried (X-Fence-Token): a record is
    /// its holder's. The 409 `outcome_unknown` answer names it.
    #[arg(long, value_name = "TOKEN")]
    fence_token: u64,
    /// The Idempotency-Key, as the client sent it (without quotes).
    #[arg(long)]
    key: String,
    /// The client certificate's name (common name, else first DNS name),
    /// where the sidecar takes client certificates (`tls.client_ca`).
    #[arg(long)]
    identity: Option<String>,
}

impl IdempotencyRecord {
    fn holder(&self) -> idempotency::Holder<'_> {
        idempotency::Holder {
            lock_key: &self.lock_key,
            token: self.fence_token,
            key: &self.key,
            identity: self.identity.as_deref(),
        }
    }
}

#[derive(Debug, Subcommand)]
enum TokenAction {
    /// A new random token (256 bits) for IDENTITY.
    New {
        /// The identity the token stands for, as the ACL names it.
        identity: String,
    },
}

/// Where the lock service is, and how to prove who we are to it: a line
/// each in a subcommand's help, explained in `fencegate --help` (`GLOBAL`).
#[derive(Debug, clap::Args)]
struct Endpoints {
    /// Node URLs, comma-separated [default: `fencegate dev`'s three].
    #[arg(long, env = "FENCEGATE_ENDPOINTS", value_delimiter = ',', global = true, help_heading = CONNECTION)]
    endpoints: Option<Vec<String>>,
    /// The nodes' CA: speak HTTPS, trust only it.
    #[arg(long, env = "FENCEGATE_CA", value_name = "PEM", global = true, help_heading = CONNECTION)]
    ca: Option<PathBuf>,
    /// Client certificate (mTLS; with --key and --ca).
    #[arg(
        long,
        env = "FENCEGATE_CERT",
        value_name = "PEM",
        requires = "tls_key",
        requires = "ca",
        global = true,
        help_heading = CONNECTION
    )]
    cert: Option<PathBuf>,
    /// Private key of --cert.
    #[arg(
        long = "key",
        id = "tls_key",
        env = "FENCEGATE_KEY",
        value_name = "PEM",
        requires = "cert",
        global = true,
        help_heading = CONNECTION
    )]
    tls_key: Option<PathBuf>,
    /// Bearer token (prefer the variable: a command line is public).
    #[arg(long, env = "FENCEGATE_TOKEN", hide_env_values = true, global = true, help_heading = CONNECTION)]
    token: Option<String>,
}

const CONNECTION: &str = "Connection (`fencegate --help` says more)";

/// `--lock-service` of `lock`, `dev` and `demo`: whose lock is taken, and
/// whose lock service `dev` and `demo` run (three fencegate nodes in this
/// process, or a one-member etcd from PATH) for their sidecar to fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LockService {
    Fencegate,
    Etcd,
}

impl LockService {
    /// The sidecar's `lock_service.kind` for it.
    fn kind(self) -> crate::config::sidecar::LockServiceKind {
        match self {
            LockService::Fencegate => crate::config::sidecar::LockServiceKind::Fencegate,
            LockService::Etcd => crate::config::sidecar::LockServiceKind::Etcd,
        }
    }
}

/// Where a local etcd listens for clients, by default.
const ETCD_ENDPOINT: &str = "http://127.0.0.1:2379";

impl Endpoints {
    /// The endpoints given, else the default ones. A bearer token over plain
    /// HTTP is not sent to ports nobody named: on a shared machine any user
    /// may listen on 7402 while node 2 is down, and take it.
    fn urls(&self) -> anyhow::Result<Vec<String>> {
        match &self.endpoints {
            Some(urls) => Ok(urls.clone()),
            None if self.token.is_some() && self.ca.is_none() => anyhow::bail!(
                "--token needs --endpoints (or FENCEGATE_ENDPOINTS): a token over plain HTTP is sent only to the nodes you name"
            ),
            None => Ok(fencegate_client::DEFAULT_ENDPOINTS.iter().map(|u| u.to_string()).collect()),
        }
    }

    fn client(self) -> anyhow::Result<fencegate_client::Client> {
        self.client_or(&fencegate_client::DEFAULT_ENDPOINTS)
    }

    /// A client of the endpoints given, else of `defaults`.
    fn client_or(self, defaults: &[&str]) -> anyhow::Result<fencegate_client::Client> {
        let urls = match self.endpoints {
            None if self.token.is_none() => defaults.iter().map(|u| u.to_string()).collect(),
            _ => self.urls()?,
        };
        let tls = match self.ca {
            None => None,
            Some(ca) => {
                let files = fencegate_client::tls::TlsFiles { ca, cert: self.cert, key: self.tls_key };
                Some(files.client_config(["--ca", "--cert", "--key"])?)
            }
        };
        let options = fencegate_client::ClientOptions { tls, token: self.token, ..Default::default() };
        Ok(fencegate_client::Client::with_options(urls, options)?)
    }
}

/// A lock key, checked as every node checks it: a bad one is a usage
/// error (exit 2), not a request refused.
fn lock_key(s: &str) -> Result<String, String> {
    crate::lock::validate::key(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

/// `--holder`, checked as every node checks it.
fn holder(s: &str) -> Result<String, String> {
    crate::lock::validate::holder(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

/// `--ttl`: at least what any node can grant (`validate::MIN_TTL`). A
/// cluster's own range (`lease.min_ttl`..`lease.max_ttl`) is its config's,
/// unknown here: a TTL outside it is refused by the node.
fn ttl(s: &str) -> Result<std::time::Duration, String> {
    let ttl = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    let min = crate::lock::validate::MIN_TTL;
    if ttl < min {
        let d = crate::config::node::LeaseConfig::default();
        return Err(format!(
            "a lease lasts at least {} (a cluster grants lease.min_ttl to lease.max_ttl, by default {} to {})",
            humantime::format_duration(min),
            humantime::format_duration(d.min_ttl),
            humantime::format_duration(d.max_ttl)
        ));
    }
    Ok(ttl)
}

/// `--wait`: at most what any node waits (`validate::MAX_WAIT`).
fn wait(s: &str) -> Result<std::time::Duration, String> {
    let wait = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    let max = crate::lock::validate::MAX_WAIT;
    if wait > max {
        return Err(format!(
            "no lock service waits longer than {} (a cluster's limit is its lease.max_wait, by default {})",
            humantime::format_duration(max),
            humantime::format_duration(crate::config::node::LeaseConfig::default().max_wait)
        ));
    }
    Ok(wait)
}

/// An operation id: something an idempotency key can start with.
fn operation_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    ok.then(|| s.to_string()).ok_or_else(|| "1 to 128 of A-Z a-z 0-9 - _ . :".into())
}

impl Cli {
    /// The command line of this process, as [`Cli::parse_args`] takes it;
    /// on an error, clap's message and exit status 2.
    pub fn parse_from_env() -> Cli {
        Self::parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parse `args` (the program's name first). The connection options
    /// (`--endpoints`, `--ca`, `--cert`, `--key`, `--token`) belong to the
    /// subcommands that talk to the lock service, and may also come before
    /// the subcommand: `fencegate --endpoints URL status` is
    /// `fencegate status --endpoints URL`.
    pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        Cli::try_parse_from(hoist_connection_options(args.into_iter().map(Into::into).collect()))
    }
}

/// `args` with the connection options given before the subcommand moved
/// after its last subcommand name (`fencegate --endpoints U member list` →
/// `fencegate member list --endpoints U`), where they are declared. One that
/// is not an option of that subcommand is then an error of clap's, as it
/// would be there.
fn hoist_connection_options(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::{Args, CommandFactory};
    let connection = Endpoints::augment_args(clap::Command::new("connection"));
    // (long name, whether it takes a value), from the options themselves.
    let options: Vec<(String, bool)> = connection
        .get_arguments()
        .filter_map(|a| Some((a.get_long()?.to_string(), a.get_action().takes_values())))
        .collect();
    let top = Cli::command();
    let top_values: Vec<String> = top
        .get_arguments()
        .filter(|a| a.get_action().takes_values())
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let mut rest = args.into_iter();
    let mut out: Vec<std::ffi::OsString> = rest.next().into_iter().collect();
    let mut hoisted = Vec::new();
    // Up to the subcommand's name: the top level's options and ours.
    let mut next = None;
    while let Some(arg) = rest.next() {
        let Some(text) = arg.to_str().filter(|t| t.starts_with('-') && *t != "-" && *t != "--") else {
            next = Some(arg);
            break;
        };
        if !text.starts_with("--") {
            // The top level's short flags (-v, -h, -V) take no value.
            out.push(arg);
            continue;
        }
        let name = text[2..].split('=').next().unwrap_or_default().to_string();
        let inline = text.contains('=');
        if let Some(&(_, takes_value)) = options.iter().find(|(long, _)| *long == name) {
            hoisted.push(arg);
            if takes_value && !inline {
                hoisted.extend(rest.next());
            }
        } else {
            let takes_value = top_values.contains(&name) && !inline;
            out.push(arg);
            if takes_value {
                out.extend(rest.next());
            }
        }
    }
    let Some(first) = next else {
        out.extend(hoisted);
        return out;
    };
    if hoisted.is_empty() {
        out.push(first);
        out.extend(rest);
        return out;
    }
    // Down the subcommand names given, to the last one.
    let mut command = top.find_subcommand(&first).cloned();
    out.push(first);
    let mut rest = rest.peekable();
    while let Some(c) = command.take() {
        match rest.peek().and_then(|a| c.find_subcommand(a)) {
            Some(sub) => {
                command = Some(sub.clone());
                out.extend(rest.next());
            }
            None => break,
        }
    }
    out.extend(hoisted);
    out.extend(rest);
    out
}

/// Run a subcommand, returning the process exit status.
pub fn run(cli: Cli) -> i32 {
    // Before any thread: what these write is the process's alone. Not for
    // `lock`, whose CMD inherits the caller's umask.
    if matches!(
        cli.command,
        Command::Server { .. }
            | Command::Sidecar { .. }
            | Command::Snapshot { .. }
            | Command::Dev { .. }
            | Command::Demo { .. }
    ) {
        crate::private::own_files_only();
    }
    // Known before the command takes its endpoints: whether they are the defaults.
    let defaults = cli.command.endpoints().map(|e| e.endpoints.is_none());
    let kind = match cli.command {
        Command::Server { .. } | Command::Sidecar { .. } | Command::Inventory { .. } => logging::Kind::Service,
        Command::Dev { .. } => logging::Kind::Dev,
        Command::Demo { .. } => logging::Kind::Demo,
        _ => logging::Kind::OneShot,
    };
    logging::init(logging::default_filter(kind, cli.verbose), cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("starting the tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Server { config } => server::run(&config).await,
            Command::Sidecar { config } => sidecar::run(&config).await,
            Command::Status { key, json, endpoints } => status::run(key, json, endpoints.client()?).await,
            Command::Lock { key, ttl, wait, holder, grace, operation_id, lock_service, endpoints, command } => {
                let operation_id = operation_id.unwrap_or_else(fencegate_client::idempotency::operation_id);
                let etcd = lock_service == LockService::Etcd;
                if etcd && (holder.is_some() || endpoints.token.is_some()) {
                    // A usage error (2), as clap's own: nothing was asked of etcd.
                    let why = "--holder and --token are fencegate's: etcd's lock names no holder and takes no token";
                    <Cli as clap::CommandFactory>::command()
                        .error(clap::error::ErrorKind::ArgumentConflict, why)
                        .exit();
                }
                let client = match etcd {
                    true => endpoints.client_or(&[ETCD_ENDPOINT])?,
                    false => endpoints.client()?,
                };
                let args = lock::LockArgs { key, ttl, wait, holder, grace, operation_id, client, etcd, command };
                lock::run(args).await
            }
            Command::Member { action, endpoints } => {
                let client = endpoints.client()?;
                let list = match action {
                    MemberAction::List => client.members().await?,
                    MemberAction::Add { id, peer_url, client_url, force } => {
                        let add = fencegate_client::wire::AddMember { id, peer_url, client_url, force };
                        client.add_member(&add).await?
                    }
                    MemberAction::Remove { id, force } => client.remove_member(id, force).await?,
                };
                status::members(&list);
                Ok(0)
            }
            Command::Snapshot { action: SnapshotAction::Save { file, endpoints } } => {
                snapshot::save(&file, endpoints.client()?).await
            }
            Command::Snapshot { action: SnapshotAction::Inspect { file } } => snapshot::inspect(&file),
            Command::Snapshot { action: SnapshotAction::Restore { file, config, min_token } } => {
                snapshot::restore(&file, &config, min_token)
            }
            Command::Token { action: TokenAction::New { identity } } => token::new(&identity),
            Command::Idempotency { action: IdempotencyAction::Show { record: r, json } } => {
                idempotency::run(&r.sidecar, &r.token_file, r.holder(), None, json).await
            }
            Command::Idempotency { action: IdempotencyAction::Resolve { record: r, applied, .. } } => {
                idempotency::run(&r.sidecar, &r.token_file, r.holder(), Some(applied), false).await
            }
            Command::Demo { ttl, pause, mermaid, lock_service, endpoints, sidecar, inventory } => {
                let remote = match (endpoints, sidecar, inventory) {
                    (Some(endpoints), Some(sidecar_url), Some(inventory_url)) => {
                        Some(demo::Targets { endpoints, sidecar_url, inventory_url })
                    }
                    _ => None,
                };
                let backend = lock_service;
                demo::run(demo::DemoArgs { ttl, pause, mermaid, backend, remote }).await
            }
            Command::Inventory { listen } => inventory::run(listen).await,
            Command::Dev { data, fresh, free_ports, lock_service } => {
                dev::run(&data, fresh, free_ports, lock_service).await
            }
            Command::Healthcheck { url, timeout, ca } => healthcheck::run(&url, timeout, ca).await,
            Command::CheckConfig { file } => Ok(check_config(&file).map(|()| 0)?),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencegate: {e:#}{}", hint(&e, defaults));
            exit::for_error(&e)
        }
    }
}

/// The likely fix, after an error whose cause a person can guess: nothing
/// listening at the endpoints, which are `fencegate dev`'s when
/// `defaults` (`Some(true)`).
fn hint(e: &anyhow::Error, defaults: Option<bool>) -> &'static str {
    match (e.downcast_ref::<fencegate_client::ClientError>(), defaults) {
        (Some(c), Some(true)) if c.no_node_answered() => {
            "; is `fencegate dev` running? (these are its nodes; else give --endpoints or FENCEGATE_ENDPOINTS)"
        }
        (Some(c), Some(false)) if c.no_node_answered() => "; is a fencegate node listening there?",
        _ => "",
    }
}

impl Command {
    /// The connection options of a command that talks to the lock service.
    fn endpoints(&self) -> Option<&Endpoints> {
        match self {
            Command::Lock { endpoints, .. }
            | Command::Status { endpoints, .. }
            | Command::Member { endpoints, .. }
            | Command::Snapshot { action: SnapshotAction::Save { endpoints, .. } } => Some(endpoints),
            _ => None,
        }
    }
}

fn check_config(file: &std::path::Path) -> Result<(), ConfigError> {
    check_config_file(file).map_err(|e| e.in_file(file))
}

fn check_config_file(file: &std::path::Path) -> Result<(), ConfigError> {
    let text = crate::config::read(file)?;
    let doc: serde_yaml_ng::Value = crate::config::parse_yaml(&text)?;
    // By what the file says it is, else by fields only one kind has; never
    // by which parse fails.
    let sidecar = match doc.get("kind") {
        Some(kind) => match serde_yaml_ng::from_value::<crate::config::Kind>(kind.clone()) {
            Ok(kind) => kind == crate::config::Kind::Sidecar,
            Err(_) => return Err(ConfigError::invalid("kind", "must be `sidecar` or `node`")),
        },
        None => match (doc.get("routes").is_some(), doc.get("peers").is_some()) {
            (sidecar, node) if sidecar != node => sidecar,
            _ => {
                return Err(ConfigError::invalid(
                    "kind",
                    "say `kind: sidecar` or `kind: node` (a sidecar config has `routes`, a node config has \
                     `peers`: this file has both or neither)",
                ))
            }
        },
    };
    if sidecar {
        let c = crate::config::sidecar::SidecarConfig::from_yaml(&text)?;
        // The files it names too: a mistyped cert path is found here, not at startup.
        c.load_tls()?;
        println!("{}: ok (sidecar, {} routes)", file.display(), c.routes.iter().count());
    } else {
        let c = crate::config::node::NodeConfig::from_yaml(&text)?;
        // The files it names too: certificates, keys, the tokens file, the peer secret.
        crate::tls::NodeTls::load(&c)?;
        crate::server::credentials::Credentials::load(&c)?;
        crate::server::credentials::peer_secrets(&c)?;
        let security = match (&c.tls, c.clients_authenticate()) {
            (Some(_), true) => "TLS, clients authenticate",
            (Some(_), false) => "TLS, clients anonymous",
            (None, true) => "plain HTTP, clients authenticate",
            (None, false) => "plain HTTP, clients anonymous",
        };
        println!("{}: ok (lock service node; {security})", file.display());
        println!("peer plane: {}", c.peer_plane());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command that talks to the lock service defaults to the three
    /// local nodes, so that one of them being down changes nothing.
    #[test]
    fn commands_default_to_the_three_local_nodes() {
        if std::env::var_os("FENCEGATE_ENDPOINTS").is_some() {
            return; // The environment decides then, as it should.
        }
        let three = ["http://127.0.0.1:7401", "http://127.0.0.1:7402", "http://127.0.0.1:7403"];
        for args in [&["status"][..], &["lock", "k", "--", "true"], &["member", "list"], &["snapshot", "save", "f"]] {
            let cli = Cli::try_parse_from(std::iter::once("fencegate").chain(args.iter().copied())).unwrap();
            let endpoints = match cli.command {
                Command::Status { endpoints, .. }
                | Command::Lock { endpoints, .. }
                | Command::Member { endpoints, .. }
                | Command::Snapshot { action: SnapshotAction::Save { endpoints, .. } } => endpoints,
                other => panic!("{other:?}"),
            };
            assert_eq!(endpoints.urls().unwrap(), three, "{args:?}");
        }
    }

    /// The logging and connection paragraphs are said once, in `fencegate
    /// --help`; a subcommand's help gives the global flags and the
    /// connection options a line each (it repeated the paragraphs in clap's
    /// long layout, and `lock --help` ran to 87 lines).
    #[test]
    fn the_global_flags_are_explained_once() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        cli.build();
        let top = cli.render_long_help().to_string();
        for said in ["log shipper", "FENCEGATE_LOG", "visible to every user", "followers forward"] {
            assert!(top.contains(said), "{said}:\n{top}");
        }
        for sub in cli.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let help = sub.render_long_help().to_string();
            let name = sub.get_name().to_string();
            for paragraph in ["log shipper", "visible to every user"] {
                assert!(!help.contains(paragraph), "`{name} --help` repeats a paragraph:\n{help}");
            }
            assert!(help.contains("--log-format") && help.contains("--verbose"), "{name}:\n{help}");
        }
        // As `--help` prints it: clap's long layout only where a long help exists.
        let lock = Cli::command().try_get_matches_from(["fencegate", "lock", "--help"]).unwrap_err().to_string();
        for said in ["--ttl", "--wait", "--holder", "--grace", "--operation-id", "--endpoints", "--token", "76 "] {
            assert!(lock.contains(said), "{said}:\n{lock}");
        }
        assert!(lock.lines().count() <= 50, "{} lines:\n{lock}", lock.lines().count());
    }

    /// The endpoints may follow a subcommand (`member list --endpoints URL`),
    /// as they follow `snapshot save FILE`.
    #[test]
    fn endpoints_are_taken_after_a_subcommand_too() {
        for args in
            [&["member", "list", "--endpoints", "http://n:1"][..], &["member", "--endpoints", "http://n:1", "list"]]
        {
            let cli = Cli::try_parse_from(std::iter::once("fencegate").chain(args.iter().copied())).unwrap();
            let Command::Member { endpoints, .. } = cli.command else { panic!("{args:?}") };
            assert_eq!(endpoints.urls().unwrap(), ["http://n:1"], "{args:?}");
        }
    }

    /// Nobody answering at the default endpoints suggests starting `fencegate
    /// dev`; at named ones, checking that a node listens there; nothing else
    /// gets a hint.
    #[test]
    fn nobody_answering_gets_a_hint_by_whose_endpoints_they_were() {
        use fencegate_client::ClientError;
        let nobody = || anyhow::Error::new(ClientError::Unavailable("no node answered; tried x".into()));
        assert!(hint(&nobody(), Some(true)).contains("is `fencegate dev` running?"));
        assert_eq!(hint(&nobody(), Some(false)), "; is a fencegate node listening there?");
        assert_eq!(
            hint(&nobody().context("rack/1 not obtained"), Some(false)),
            "; is a fencegate node listening there?"
        );
        let no_quorum = anyhow::Error::new(ClientError::Unavailable("tried x (last error: no quorum)".into()));
        assert_eq!(hint(&no_quorum, Some(true)), "");
        assert_eq!(hint(&anyhow::anyhow!("other"), Some(true)), "");
    }

    /// Every subcommand that declares the connection options takes them
    /// after itself and before itself (`fencegate --endpoints U SUB …`),
    /// and hands them to the command: found by walking the whole command
    /// tree, so that a subcommand added later is covered.
    #[test]
    fn every_command_with_connection_options_takes_them_before_and_after_itself() {
        use clap::CommandFactory;
        let mut top = Cli::command();
        top.build();
        // Each leaf that takes them: (its path, a value for each required
        // positional, whether it ends with `-- CMD`).
        type Leaf = (Vec<String>, Vec<String>, bool);
        fn walk(c: &clap::Command, path: Vec<String>, leaves: &mut Vec<Leaf>) {
            for sub in c.get_subcommands() {
                let mut p = path.clone();
                p.push(sub.get_name().to_string());
                walk(sub, p, leaves);
            }
            if !c.has_subcommands() && c.get_arguments().any(|a| a.get_id() == "tls_key") {
                let required = c.get_positionals().filter(|a| a.is_required_set() && !a.is_last_set());
                let last = c.get_positionals().any(|a| a.is_last_set());
                leaves.push((path, required.map(|_| "1".to_string()).collect(), last));
            }
        }
        let mut leaves: Vec<Leaf> = Vec::new();
        walk(&top, vec![], &mut leaves);
        let names: Vec<String> = leaves.iter().map(|(p, ..)| p.join(" ")).collect();
        for expected in ["lock", "status", "member list", "member add", "member remove", "snapshot save"] {
            assert!(names.iter().any(|n| n == expected), "{expected} not among {names:?}");
        }
        let options =
            ["--endpoints", "http://n:1", "--ca", "ca.pem", "--cert", "c.pem", "--key", "k.pem", "--token", "t"];
        for (path, required, last) in &leaves {
            let cmd_tail: &[&str] = if *last { &["--", "true"] } else { &[] };
            let head = path.iter().map(String::as_str).chain(required.iter().map(String::as_str));
            let before: Vec<&str> =
                ["fencegate"].into_iter().chain(options).chain(head.clone()).chain(cmd_tail.iter().copied()).collect();
            let after: Vec<&str> =
                ["fencegate"].into_iter().chain(head).chain(options).chain(cmd_tail.iter().copied()).collect();
            for args in [before, after] {
                let cli = Cli::parse_args(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
                let e =
                    cli.command.endpoints().unwrap_or_else(|| panic!("{args:?}: its connection options are not used"));
                assert_eq!(e.endpoints.as_deref(), Some(&["http://n:1".to_string()][..]), "{args:?}");
                assert_eq!(
                    (e.ca.as_deref(), e.cert.as_deref(), e.tls_key.as_deref(), e.token.as_deref()),
                    (Some("ca.pem".as_ref()), Some("c.pem".as_ref()), Some("k.pem".as_ref()), Some("t")),
                    "{args:?}"
                );
            }
        }
        // With the top level's own options around them, and in `--opt=value` form.
        let cli =
            Cli::parse_args(["fencegate", "-v", "--endpoints=http://n:1", "--log-format", "json", "member", "list"])
                .unwrap();
        assert_eq!(cli.command.endpoints().unwrap().endpoints.as_deref(), Some(&["http://n:1".to_string()][..]));
        // Before a command that takes none, they are refused as after it.
        assert!(Cli::parse_args(["fencegate", "--endpoints", "http://n:1", "token", "new", "x"]).is_err());
    }

    /// A token over plain HTTP goes only to endpoints someone named.
    #[test]
    fn a_token_is_not_sent_to_default_endpoints() {
        if std::env::var_os("FENCEGATE_ENDPOINTS").is_some() {
            return;
        }
        let parse =
            |args: &[&str]| match Cli::try_parse_from(["fencegate", "status"].iter().chain(args)).unwrap().command {
                Command::Status { endpoints, .. } => endpoints.urls(),
                other => panic!("{other:?}"),
            };
        let e = parse(&["--token", "t"]).unwrap_err();
        assert!(e.to_string().contains("--token needs --endpoints"), "{e}");
        let named = parse(&["--token", "t", "--endpoints", "http://10.0.0.1:7401"]).unwrap();
        assert_eq!(named, ["http://10.0.0.1:7401"]);
    }
}
