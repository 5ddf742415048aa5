//! Where log lines go and how they look (docs/DESIGN.md "Logs"): stderr,
//! filtered by `FENCEGATE_LOG` (else `RUST_LOG`), as text or as one JSON
//! object per line (`--log-format json`, for log shippers); colour only on
//! a terminal, and never with `NO_COLOR` set.

use std::io::IsTerminal;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum LogFormat {
    /// One line per event, for a person.
    Text,
    /// One JSON object per event (`timestamp`, `level`, `target`, `fields`).
    Json,
}

/// What a command is, for its default log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A long-running process (`server`, `sidecar`, `dev`, `inventory`):
    /// its INFO lines are its record.
    Service,
    /// A one-shot command (`lock`, `status`, …), often run from cron: quiet
    /// on success, so that nothing is mailed when nothing went wrong.
    OneShot,
    /// `demo`, which prints its own timeline: only errors besides it.
    Demo,
    /// `dev`: three nodes, a sidecar and the inventory in one process,
    /// under its banner: warnings, and each applied change once (node 1's
    /// audit line), not the nodes' start-up lines or each change thrice.
    Dev,
}

/// The filter when neither variable is set; `verbose` (`-v`) raises a
/// one-shot command or the demo to INFO. openraft's own lines are off:
/// its elections are routine, its RPC failures repeat per heartbeat (the
/// peer network logs those itself, once per interval: `raft::network`), and
/// a fatal error of its core is logged by `cli::server` when the node exits.
pub(super) fn default_filter(kind: Kind, verbose: bool) -> &'static str {
    match (kind, verbose) {
        (Kind::Service, _) | (_, true) => "info,openraft=off",
        (Kind::OneShot, false) => "warn,openraft=off",
        (Kind::Demo, false) => "error,openraft=off",
        (Kind::Dev, false) => "warn,openraft=off,fencegate::audit[node{id=1}]=info",
    }
}

/// Colour only for a person at a terminal who did not ask for none
/// (<https://no-color.org>: any non-empty `NO_COLOR`).
pub(super) fn ansi(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

pub(super) fn init(default: &str, format: LogFormat) {
    let filter = ["FENCEGATE_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| tracing_subscriber::EnvFilter::try_from_env(var).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let ansi = ansi(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    // Not `eprintln!` on a failed write (a full disk, a closed pipe): it
    // panics, and kills whatever task was logging — a Raft core, a batcher.
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => fmt.try_init(),
        LogFormat::Json => fmt.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(ansi(true, None));
        assert!(ansi(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count");
        assert!(!ansi(true, Some(OsStr::new("1"))));
        assert!(!ansi(false, None), "a file or a pipe gets no escape codes");
    }
}
