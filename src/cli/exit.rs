//! The exit statuses of `fencegate` (docs/DESIGN.md "Exit status"), and the
//! one mapping from an error to its status. Numbers from sysexits.h where
//! one fits, so that scripts and supervisors can tell the causes apart.
//!
//! 64 config, 69 lock service or listen address unavailable, 70 Raft core
//! stopped (`fencegate server`, so that a supervisor restarts it), 75 held,
//! 76 lost, 130/143 signals, 141 a closed stdout.

use fencegate_client::ClientError;

use crate::config::ConfigError;
use crate::http::CannotListen;

/// A bad configuration file, or one naming files that cannot be used (EX_USAGE).
pub(crate) const BAD_CONFIG: i32 = crate::config::EXIT_BAD_CONFIG;
/// Something outside the process is not there (EX_UNAVAILABLE): the lock
/// service did not answer (no node, no quorum, within the failover budget),
/// or an address to listen on is taken.
pub(crate) const UNAVAILABLE: i32 = 69;
/// `lock`: the key is held by someone else, and was not obtained within
/// `--wait` (EX_TEMPFAIL: try again later).
pub(crate) const NOT_OBTAINED: i32 = 75;
/// `lock`: the lease was lost while CMD ran.
pub(crate) const LEASE_LOST: i32 = 76;
/// `lock`: CMD exists but cannot be run (not executable, say), as a shell
/// reports it; the lease was released.
pub(crate) const CANNOT_EXECUTE: i32 = 126;
/// `lock`: CMD was not found, as a shell reports it; the lease was released.
pub(crate) const COMMAND_NOT_FOUND: i32 = 127;
/// Standard output closed by its reader (`… | head`): 128 + SIGPIPE, the
/// status a shell reports for a coreutils tool there, quietly.
pub(crate) const BROKEN_PIPE: i32 = 141;
/// Ended by Ctrl-C (SIGINT), as a shell reports it: 128 + 2.
pub(crate) const INTERRUPTED: i32 = 130;
/// Ended by SIGTERM: 128 + 15.
pub(crate) const TERMINATED: i32 = 143;

/// The status for a command that failed with `e`: 64 for configuration
/// errors, 69 when the lock service or a listen address is unavailable,
/// else 1.
pub(crate) fn for_error(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<ConfigError>().is_some() {
        BAD_CONFIG
    } else if matches!(e.downcast_ref::<ClientError>(), Some(ClientError::Unavailable(_)))
        || e.downcast_ref::<CannotListen>().is_some()
    {
        UNAVAILABLE
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_has_its_status_through_added_context() {
        let config = anyhow::Error::new(ConfigError::invalid("id", "must be 1 or more")).context("starting");
        assert_eq!(for_error(&config), 64);
        let down = anyhow::Error::new(ClientError::Unavailable("no node answered".into())).context("rack/1");
        assert_eq!(for_error(&down), 69);
        let taken = CannotListen::new("listen", "127.0.0.1:1".parse().unwrap(), std::io::ErrorKind::AddrInUse.into());
        assert_eq!(for_error(&anyhow::Error::new(taken)), 69);
        let refused = ClientError::Refused {
            status: hyper::StatusCode::BAD_REQUEST,
            error: fencegate_client::wire::ErrorCode::BadRequest,
            message: "bad key".into(),
        };
        assert_eq!(for_error(&anyhow::Error::new(refused)), 1);
    }
}
