//! wrk (Debian's `wrk`), a second HTTP load generator beside `load.rs`: a
//! small C program, one event loop per thread, lighter than ours, so the
//! servers under test keep more of the cores. Closed loop; each latency runs
//! from when a request is written to when its answer is read. The request
//! is the one our generator sends (method, path, headers, body), written to
//! a Lua script. Not declared in `mod.rs`: `proxies` uses it (`#[path]`).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// The quantiles `--latency` prints, in percent.
pub const PERCENTS: [u32; 4] = [50, 75, 90, 99];

/// What one wrk run reported.
#[derive(Debug, Clone, Default)]
pub struct WrkRun {
    pub requests: u64,
    pub requests_per_second: f64,
    /// Latency at each of `PERCENTS`, µs.
    pub latency_us: Vec<(u32, f64)>,
    /// "Non-2xx or 3xx responses" (wrk counts statuses above 399).
    pub non_2xx: u64,
    /// "Socket errors": connect + read + write + timeout.
    pub socket_errors: u64,
}

impl WrkRun {
    /// Latency at `percent` (one of `PERCENTS`), µs.
    pub fn us(&self, percent: u32) -> f64 {
        self.latency_us.iter().find(|(p, _)| *p == percent).map(|(_, us)| *us).expect("a percent wrk prints")
    }
}

/// A run that measured nothing usable, with what wrk printed.
#[derive(Debug)]
pub struct Failure {
    pub why: String,
    /// Non-2xx answers, when wrk got as far as counting them.
    pub non_2xx: u64,
    pub output: String,
}

/// Whether `wrk` can be started (it is on PATH).
pub fn available() -> bool {
    std::process::Command::new("wrk").arg("-v").output().is_ok()
}

/// Write to `script` a wrk script that sends `req` on every request.
pub async fn write_script(script: &Path, req: hyper::Request<Full<Bytes>>) {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.expect("a full body").to_bytes();
    let mut lua = format!(
        "-- Written by the benchmark: the request its own load generator sends.\nwrk.method = {}\nwrk.path = {}\n",
        lua_string(parts.method.as_str().as_bytes()),
        lua_string(parts.uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes()),
    );
    for (name, value) in &parts.headers {
        // wrk adds Host unless `wrk.headers["Host"]` is set (case matters
        // there): write the names in their canonical case.
        lua.push_str(&format!(
            "wrk.headers[{}] = {}\n",
            lua_string(canonical(name.as_str()).as_bytes()),
            lua_string(value.as_bytes())
        ));
    }
    // wrk sets Content-Length from the body.
    if !body.is_empty() {
        lua.push_str(&format!("wrk.body = {}\n", lua_string(&body)));
    }
    std::fs::write(script, lua).unwrap();
}

/// "x-fence-token" → "X-Fence-Token".
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut c = part.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// A Lua string literal of any bytes (decimal escapes but for [A-Za-z0-9 /_-]).
fn lua_string(bytes: &[u8]) -> String {
    let mut s = String::from("\"");
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b" /_-.".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\{b:03}"));
        }
    }
    s.push('"');
    s
}

/// `wrk -t<threads> -c<connections> -d<seconds>s --latency -s <script>`
/// against `http://127.0.0.1:<port><path>`. wrk is killed if it has not
/// exited 20 s after the run's end. Non-2xx answers and socket errors
/// make a failure, as does a run with no answer at all.
pub async fn run(
    port: u16,
    path: &str,
    script: &Path,
    threads: usize,
    connections: usize,
    seconds: u64,
) -> Result<WrkRun, Failure> {
    let fail = |why: String, output: String| Failure { why, non_2xx: 0, output };
    let mut cmd = tokio::process::Command::new("wrk");
    cmd.arg(format!("-t{threads}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .stdin(std::process::Stdio::null())
        // Dropped on the timeout below: the child is killed (SIGKILL) then.
        .kill_on_drop(true);
    let within = Duration::from_secs(seconds + 20);
    let out = match tokio::time::timeout(within, cmd.output()).await {
        Err(_) => {
            return Err(fail(format!("wrk still running {} s after its start: killed", within.as_secs()), "".into()))
        }
        Ok(Err(e)) => return Err(fail(format!("wrk did not start: {e}"), "".into())),
        Ok(Ok(out)) => out,
    };
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(fail(format!("wrk exited with {}", out.status), output));
    }
    let run = match parse(&output) {
        Ok(run) => run,
        Err(why) => return Err(fail(format!("wrk's output: {why}"), output)),
    };
    if run.non_2xx > 0 || run.socket_errors > 0 || run.requests == 0 {
        return Err(Failure {
            why: format!(
                "{} non-2xx answers and {} socket errors in {} requests",
                run.non_2xx, run.socket_errors, run.requests
            ),
            non_2xx: run.non_2xx,
            output,
        });
    }
    Ok(run)
}

/// The numbers in wrk's report (4.x, with `--latency`).
pub fn parse(output: &str) -> Result<WrkRun, String> {
    let mut run = WrkRun::default();
    let mut rps = None;
    let mut in_distribution = false;
    for line in output.lines() {
        let line = line.trim();
        if line == "Latency Distribution" {
            in_distribution = true;
            continue;
        }
        if in_distribution {
            // "50%  370.00us"
            if let Some((percent, time)) = line.split_once('%') {
                if let Ok(percent) = percent.trim().parse::<f64>() {
                    run.latency_us.push((percent.round() as u32, time_us(time.trim())?));
                    continue;
                }
            }
            in_distribution = false;
        }
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            rps = Some(v.trim().parse::<f64>().map_err(|e| format!("Requests/sec {v:?}: {e}"))?);
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            run.non_2xx = v.trim().parse().map_err(|e| format!("Non-2xx {v:?}: {e}"))?;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for field in v.split(',') {
                let n = field.split_whitespace().nth(1).ok_or_else(|| format!("Socket errors {v:?}"))?;
                run.socket_errors += n.parse::<u64>().map_err(|e| format!("Socket errors {v:?}: {e}"))?;
            }
        } else if let Some((n, _)) = line.split_once(" requests in ") {
            run.requests = n.trim().parse().map_err(|e| format!("requests {n:?}: {e}"))?;
        }
    }
    run.requests_per_second = rps.ok_or("no Requests/sec")?;
    for p in PERCENTS {
        if !run.latency_us.iter().any(|(q, _)| *q == p) {
            return Err(format!("no {p}% in the latency distribution"));
        }
    }
    Ok(run)
}

/// wrk's time ("370.00us", "1.25ms", "2.00s", "1.50m", "1.00h") in µs.
fn time_us(s: &str) -> Result<f64, String> {
    const UNITS: [(&str, f64); 5] = [("us", 1.0), ("ms", 1e3), ("s", 1e6), ("m", 60.0 * 1e6), ("h", 3600.0 * 1e6)];
    for (unit, scale) in UNITS {
        if let Some(n) = s.strip_suffix(unit) {
            if let Ok(v) = n.parse::<f64>() {
                return Ok(v * scale);
            }
        }
    }
    Err(format!("a time wrk printed: {s:?}"))
}

/// The parser on a wrk 4.1 report (Debian 12's), checked before a run
/// relies on it (benchmarks here have no test harness).
pub fn check_parser() {
    let out = "Running 2s test @ http://127.0.0.1:1/racks/1\n  2 threads and 32 connections\n  \
               Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   1.02ms  300.00us  25.00ms   90.00%\n    \
               Req/Sec    15.00k     1.00k   17.00k    70.00%\n  Latency Distribution\n     50%  812.00us\n     \
               75%    1.10ms\n     90%    1.50ms\n     99%    2.50s \n  60000 requests in 2.00s, 6.00MB read\n  \
               Socket errors: connect 0, read 2, write 0, timeout 3\n  Non-2xx or 3xx responses: 7\n\
               Requests/sec:  29998.50\nTransfer/sec:      3.00MB\n";
    let run = parse(out).unwrap();
    assert_eq!(run.requests, 60000);
    assert_eq!(run.requests_per_second, 29998.5);
    assert_eq!((run.us(50), run.us(75), run.us(90), run.us(99)), (812.0, 1100.0, 1500.0, 2_500_000.0));
    assert_eq!((run.non_2xx, run.socket_errors), (7, 5));
    assert_eq!(time_us("1.50m").unwrap(), 90e6);
    assert!(parse("Requests/sec: 1\n").is_err());
    assert_eq!(canonical("x-fence-token"), "X-Fence-Token");
    assert_eq!(lua_string(b"{\"a\":1}"), "\"\\123\\034a\\034\\0581\\125\"");
}
