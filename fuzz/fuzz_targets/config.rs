//! The two config files: `NodeConfig::from_yaml` and
//! `SidecarConfig::from_yaml` (parse, then `validate`), on any text. A bad
//! file must be an error that names what is wrong, never a panic: the
//! process would die with a backtrace instead of exit 64, and `SIGHUP`
//! reloads read the same code in a running sidecar or node.
#![no_main]

use fencegate::fuzzing::{ConfigFile, NodeConfig, SidecarConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // `load` reads the file as UTF-8 first; other bytes never get here.
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = NodeConfig::from_yaml(text) {
        assert!(!e.to_string().is_empty());
    }
    match SidecarConfig::from_yaml(text) {
        // What the sidecar does with its table next: the shadowing check
        // ran in `validate`; every route answers its accessors.
        Ok(settings) => {
            for route in settings.routes.iter() {
                let _ = (route.path(), route.lock_key(), route.fence.needs_lock_service());
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
