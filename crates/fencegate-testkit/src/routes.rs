//! Sidecar route tables as the tests write them, made into config YAML:
//!
//! ```
//! use fencegate_testkit::routes::{everything_else, rack_writes, table};
//! let yaml = table(&[rack_writes("{ mode: strict }").methods(&["PUT"]), everything_else()]);
//! assert!(yaml.starts_with("routes:\n  - name: rack-writes\n"));
//! ```

/// One route of a sidecar config.
#[derive(Debug, Clone)]
pub struct Route {
    name: String,
    path: String,
    methods: Option<String>,
    lock_key: Option<String>,
    fence: String,
    more: String,
}

impl Route {
    /// `path` fenced as `fence` says (a YAML flow map such as
    /// `{ mode: strict, consistency: cached }`) with lock key `lock_key`.
    pub fn fenced(name: &str, path: &str, lock_key: &str, fence: &str) -> Route {
        Route {
            name: name.into(),
            path: path.into(),
            methods: None,
            lock_key: Some(lock_key.into()),
            fence: fence.into(),
            more: String::new(),
        }
    }

    /// `path` passed through unfenced (`fence: off`).
    pub fn unfenced(name: &str, path: &str) -> Route {
        Route {
            name: name.into(),
            path: path.into(),
            methods: None,
            lock_key: None,
            fence: "off".into(),
            more: String::new(),
        }
    }

    /// Only these methods (default: all).
    pub fn methods(mut self, methods: &[&str]) -> Route {
        self.methods = Some(format!("[{}]", methods.join(", ")));
        self
    }

    /// The route's `timeout` (e.g. `300ms`).
    pub fn timeout(self, timeout: &str) -> Route {
        self.with("timeout", timeout)
    }

    /// The route's own `upstream`.
    pub fn upstream(self, url: &str) -> Route {
        self.with("upstream", url)
    }

    /// Any other field of the route, as YAML (`with("suffixes", "[json]")`).
    pub fn with(mut self, key: &str, value: &str) -> Route {
        self.more.push_str(&format!("    {key}: {value}\n"));
        self
    }

    fn yaml(&self) -> String {
        let mut y = format!("  - name: {}\n", self.name);
        if let Some(m) = &self.methods {
            y.push_str(&format!("    methods: {m}\n"));
        }
        y.push_str(&format!("    path: {}\n", self.path));
        if let Some(k) = &self.lock_key {
            y.push_str(&format!("    lock_key: {k}\n"));
        }
        y.push_str(&format!("    fence: {}\n{}", self.fence, self.more));
        y
    }
}

/// The `routes:` section with these routes, first match first.
pub fn table(routes: &[Route]) -> String {
    let mut y = String::from("routes:\n");
    for r in routes {
        y.push_str(&r.yaml());
    }
    y
}

/// The write route most tests fence: `rack-writes`, `/racks/{rack}` with
/// lock key `rack/{rack}`.
pub fn rack_writes(fence: &str) -> Route {
    Route::fenced("rack-writes", "/racks/{rack}", "rack/{rack}", fence)
}

/// Any other path, unfenced: `everything-else`, last.
pub fn everything_else() -> Route {
    Route::unfenced("everything-else", "/{*rest}")
}
