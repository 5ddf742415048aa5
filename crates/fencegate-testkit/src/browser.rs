//! A real browser for the consoles' tests (docs/decisions/0011): Debian's
//! headless `chromium`, driven through `chromedriver` over the W3C WebDriver
//! protocol (JSON over HTTP) with the kit's own HTTP client; no browser
//! crate. Installed by `.ci/browser`. One browser is ~390 MiB: start one at
//! a time.
//!
//! Every command is bounded in time; a failed one panics with WebDriver's
//! own error. Dropping the browser quits it (the session, then the driver;
//! a kill of both as the last resort).

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use fencegate_client::http::HttpClient;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::ports::{reserve, wait_for_port, Reserved};
use crate::process::{tail, Proc};

/// The browser itself: the `/usr/bin/chromium` wrapper script misreads a
/// twice-mounted `/dev/shm`.
const CHROMIUM: &str = "/usr/lib/chromium/chromium";
/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// One command's answer, at most (above the session's own timeouts below,
/// so that chromedriver's error arrives rather than ours).
const COMMAND: Duration = Duration::from_secs(20);
/// How often `wait_for_text` looks.
const POLL: Duration = Duration::from_millis(50);

/// A headless chromium with one session, its viewport pinned to 1280×800.
pub struct Browser {
    http: HttpClient,
    /// `http://127.0.0.1:PORT`, the driver.
    driver_url: String,
    /// `{driver_url}/session/ID`.
    session: String,
    driver: Proc,
    /// The driver's port, held for its life (as a node's).
    _port: Reserved,
    /// The driver's log.
    _dir: tempfile::TempDir,
}

/// One WebDriver command: the answer's `value`, or WebDriver's error.
async fn call(
    http: &HttpClient,
    method: &str,
    url: &str,
    body: Option<Value>,
    within: Duration,
) -> Result<Value, String> {
    let m = hyper::Method::from_bytes(method.as_bytes()).unwrap();
    let a = http.call(m, url, body.map(|b| b.to_string().into_bytes()), within).await.map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&a.body).unwrap_or_else(|_| String::from_utf8_lossy(&a.body).into());
    if a.status.is_success() {
        return Ok(v["value"].clone());
    }
    let why = match &v["value"]["error"] {
        Value::Null => v.to_string(),
        error => format!("{error}: {}", v["value"]["message"]),
    };
    Err(format!("{method} {url}: {} {why}", a.status.as_u16()))
}

impl Browser {
    /// Start chromedriver and a headless chromium under it (as root too:
    /// `--no-sandbox`). Panics, naming `.ci/browser`, if either is missing.
    pub async fn start() -> Browser {
        let on_path = |name: &str| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(name).is_file())
        };
        if !on_path("chromedriver") || !Path::new(CHROMIUM).is_file() {
            panic!("no headless browser here (chromedriver on PATH, {CHROMIUM}): `.ci/browser` installs Debian's chromium and chromium-driver");
        }
        let dir = tempfile::tempdir().unwrap();
        let port = reserve();
        let mut cmd = std::process::Command::new("chromedriver");
        // Chromium leaves a directory in $TMPDIR per run (its profile lock's
        // socket) even when it quits cleanly: in ours, removed with it.
        cmd.arg(format!("--port={}", port.port)).env("TMPDIR", dir.path());
        let driver = Proc::spawn("chromedriver", cmd, &dir.path().join("chromedriver.log"));
        wait_for_port(port.port, Duration::from_secs(10)).await;
        let driver_url = format!("http://127.0.0.1:{}", port.port);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // A page that never loads, a script that never returns, an
            // element that never comes: each fails its command in seconds.
            "timeouts": {"pageLoad": 10_000, "script": 5_000, "implicit": 2_000},
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                         "--window-size=1280,800", "--hide-scrollbars", "--lang=en-US"],
            },
            // What the page logs, and what its Content-Security-Policy blocked.
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let http = HttpClient::new(64 << 20);
        let v = call(&http, "POST", &format!("{driver_url}/session"), Some(caps), Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| {
                panic!("chromedriver did not start chromium ({e}); see .ci/browser\n{}", tail(&driver.log(), 20))
            });
        let session = format!("{driver_url}/session/{}", v["sessionId"].as_str().expect("a session id"));
        let b = Browser { http, driver_url, session, driver, _port: port, _dir: dir };
        b.set_viewport(1280, 800).await;
        b
    }

    /// `method /session/ID{path}`, its `value` or WebDriver's error.
    async fn try_cmd(&self, method: &str, path: &str, body: Value, within: Duration) -> Result<Value, String> {
        // W3C: every POST has a JSON body, `{}` if nothing else.
        let body = (method == "POST").then_some(body);
        call(&self.http, method, &format!("{}{path}", self.session), body, within).await
    }

    async fn cmd(&self, method: &str, path: &str, body: Value) -> Value {
        self.try_cmd(method, path, body, COMMAND).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Open `url` and wait for it to load (10 s at most).
    pub async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", json!({"url": url})).await;
    }

    /// Open a new tab and make it the current one; its handle.
    pub async fn new_tab(&self) -> String {
        let v = self.cmd("POST", "/window/new", json!({"type": "tab"})).await;
        let handle = v["handle"].as_str().expect("a window handle").to_string();
        self.switch_to(&handle).await;
        handle
    }

    /// Make the tab or window `handle` the current one.
    pub async fn switch_to(&self, handle: &str) {
        self.cmd("POST", "/window", json!({"handle": handle})).await;
    }

    /// The current tab's handle.
    pub async fn tab(&self) -> String {
        self.cmd("GET", "/window", Value::Null).await.as_str().expect("a window handle").to_string()
    }

    /// Make the viewport itself `width`×`height` CSS pixels (the window's
    /// size is not the viewport's): what media queries and screenshots see.
    pub async fn set_viewport(&self, width: u32, height: u32) {
        let params = json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        self.cmd("POST", "/goog/cdp/execute", json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": params}))
            .await;
    }

    /// The first element matching `css`, once there is one (2 s at most).
    async fn element(&self, css: &str) -> String {
        let v = self.try_cmd("POST", "/element", json!({"using": "css selector", "value": css}), COMMAND).await;
        let v = v.unwrap_or_else(|e| panic!("no element `{css}`: {e}"));
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("`{css}`: not an element reference: {v}")).to_string()
    }

    /// Type `text` into the element `css`, as keystrokes.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.cmd("POST", &format!("/element/{id}/value"), json!({"text": text})).await;
    }

    /// Click the element `css` (where a user would: it must be visible).
    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.cmd("POST", &format!("/element/{id}/click"), json!({})).await;
    }

    /// Until the first element matching `selector` (XPath if it starts
    /// with `/` or `(`, CSS otherwise) shows `text` as rendered text
    /// (`innerText`: what is hidden is not in it, CSS-generated content
    /// neither); that text. Looks every 50 ms; panics after `within` with
    /// what it saw last.
    pub async fn wait_for_text(&self, selector: &str, text: &str, within: Duration) -> String {
        const FIND: &str = "const s = arguments[0]; const e = /^[/(]/.test(s) \
            ? document.evaluate(s, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue \
            : document.querySelector(s); return e ? e.innerText : null;";
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(POLL);
            let seen = match tokio::time::timeout(
                left,
                self.try_cmd("POST", "/execute/sync", json!({"script": FIND, "args": [selector]}), left),
            )
            .await
            {
                Ok(Ok(Value::String(s))) if s.contains(text) => return s,
                Ok(Ok(v)) => v.to_string(),
                Ok(Err(e)) => e,
                Err(_) => "(no answer)".into(),
            };
            assert!(Instant::now() < deadline, "`{text}` not in `{selector}` within {within:?}; it showed: {seen}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Run `script` in the page as a function body (`return x` for a value).
    pub async fn js(&self, script: &str) -> Value {
        self.cmd("POST", "/execute/sync", json!({"script": script, "args": []})).await
    }

    /// A PNG of the viewport, written to `path` (its directory created).
    pub async fn screenshot(&self, path: impl AsRef<Path>) {
        let png = self.cmd("GET", "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD.decode(png.as_str().expect("base64")).expect("a PNG");
        let path = path.as_ref();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// The browser's log since the last call (each entry once): `level`
    /// (`SEVERE` for an error, a failed load, a blocked script), `message`,
    /// `source`, `timestamp`.
    pub async fn browser_log(&self) -> Vec<Value> {
        self.cmd("POST", "/se/log", json!({"type": "browser"})).await.as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A drop cannot await, and may run on a runtime's worker (or while
        // a test unwinds): the goodbyes go from a thread with a runtime of
        // its own, each bounded.
        let (session, shutdown) = (self.session.clone(), format!("{}/shutdown", self.driver_url));
        let goodbyes = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async {
                let http = HttpClient::new(1 << 20);
                // Quits chromium: a driver killed first would leave it running.
                let _ = call(&http, "DELETE", &session, None, Duration::from_secs(10)).await;
                // The driver removes its temporary profiles; a kill would leave them.
                let _ = call(&http, "GET", &shutdown, None, Duration::from_secs(2)).await;
            });
        });
        let _ = goodbyes.join();
        for _ in 0..40 {
            if self.driver.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        // Still there: the kit's kill takes the driver and all its descendants (chromium).
        self.driver.kill();
    }
}
