//! Raft log engines side by side: redb as fencegate used it (one write
//! transaction per batch, fsync on commit) beside two append-only engines,
//! raft-log 0.4.6 and raft-engine 0.4.2, and a raw file (write +
//! `fdatasync`; preallocated, the disk's floor, and appended to), each
//! opened in a new directory on the project's disk.
//!
//! Per repetition, engines in an order that rotates every repetition, each
//! in a fresh directory per phase: first, for each engine, one writer
//! making `BENCH_APPENDS` entries durable one at a time (latency of each);
//! then, for each, 64 writers for `BENCH_SECONDS` (appends/s, fsyncs/s).
//! Entries are 300 bytes of JSON.
//!
//! Run: `bench/run logstores`. Env: BENCH_REPS (default 3), BENCH_APPENDS
//! (2000), BENCH_SECONDS (5; 0 skips the concurrent phase), BENCH_ENGINES
//! (a comma-separated subset of raw, raw_appended, redb, raft_log,
//! raft_engine, raft_engine_one_group: a partial run prints its tables but
//! writes no results file). Writes bench/results/logstores.md and .json.

#[path = "../common/report.rs"]
#[allow(dead_code)] // shared by every benchmark; this one uses a part
mod report;

mod phases;
mod raft_engine_store;
mod raft_log_store;
mod stores;

use std::path::Path;
use std::time::Duration;

use report::{Spread, Table};
use serde_json::{json, Value};

use phases::Concurrent;
use stores::{Store, PAYLOAD_BYTES};

const WRITERS: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Raw,
    RawPreallocated,
    Redb,
    RaftLog,
    RaftEngine,
    /// raft-engine as one Raft log would use it: one group, its appends
    /// through the writer thread (the concurrent phase only: alone, its
    /// calls are raft-engine's).
    RaftEngineOneGroup,
}

/// The engines, in the tables' order: (kind, label, JSON key).
const ENGINES: [(Kind, &str, &str); 6] = [
    (Kind::RawPreallocated, "raw file, preallocated (floor)", "raw"),
    (Kind::Raw, "raw file, appended", "raw_appended"),
    (Kind::Redb, "redb (formats 1–4)", "redb"),
    (Kind::RaftLog, "raft-log", "raft_log"),
    (Kind::RaftEngine, "raft-engine", "raft_engine"),
    (Kind::RaftEngineOneGroup, "raft-engine, one group, writer thread", "raft_engine_one_group"),
];

fn open(kind: Kind, dir: &Path) -> Box<dyn Store> {
    let store: Box<dyn Store> = match kind {
        Kind::Raw => Box::new(stores::Raw::open(dir).unwrap()),
        Kind::RawPreallocated => Box::new(stores::Raw::preallocated(dir).unwrap()),
        Kind::Redb => Box::new(stores::Redb::open(dir).unwrap()),
        Kind::RaftLog => Box::new(raft_log_store::RaftLogStore::open(dir).unwrap()),
        Kind::RaftEngine | Kind::RaftEngineOneGroup => {
            Box::new(raft_engine_store::RaftEngineStore(raft_engine_store::open(dir).unwrap()))
        }
    };
    store
}

/// One repetition's numbers for one engine (latencies in µs); None where a
/// phase was not run.
#[derive(Default)]
struct Rep {
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    mean_us: Option<f64>,
    appends_per_s: Option<f64>,
    fsyncs_per_s: Option<f64>,
    per_fsync: Option<f64>,
    concurrent_p99_us: Option<f64>,
}

/// The one-writer phase, in a directory of its own (none for the one-group
/// variant: alone, its calls are raft-engine's).
fn one_writer(kind: Kind, base: &Path, appends: u64, rep: &mut Rep) {
    if kind == Kind::RaftEngineOneGroup {
        return;
    }
    let dir = tempfile::tempdir_in(base).unwrap();
    let one = phases::one_writer(open(kind, dir.path()).as_mut(), appends);
    rep.p50_us = Some(one.value_at_quantile(0.5) as f64);
    rep.p99_us = Some(one.value_at_quantile(0.99) as f64);
    rep.mean_us = Some(one.mean());
}

/// The concurrent phase, in a directory of its own.
fn concurrent(kind: Kind, base: &Path, seconds: f64, rep: &mut Rep) {
    let dir = tempfile::tempdir_in(base).unwrap();
    let c: Concurrent = match kind {
        Kind::RaftEngine => phases::raft_engine_direct(raft_engine_store::open(dir.path()).unwrap(), WRITERS, seconds),
        _ => phases::group_commit(open(kind, dir.path()), WRITERS, seconds),
    };
    rep.appends_per_s = Some(c.appends as f64 / c.seconds);
    rep.fsyncs_per_s = Some(c.fsyncs as f64 / c.seconds);
    rep.per_fsync = Some(c.appends as f64 / c.fsyncs.max(1) as f64);
    rep.concurrent_p99_us = Some(c.latencies.value_at_quantile(0.99) as f64);
}

/// Before a repetition's one-writer phases: the last concurrent phases
/// wrote and deleted hundreds of MiB, and one writer's latencies right
/// after them were up to 20 times its usual p99 (on this machine's virtual
/// disk). Flush it all and wait.
const SETTLE: Duration = Duration::from_secs(5);

fn settle() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(SETTLE);
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

fn main() {
    let reps: usize = env_or("BENCH_REPS", 3);
    let appends: u64 = env_or("BENCH_APPENDS", 2000);
    let seconds: f64 = env_or("BENCH_SECONDS", 5.0);
    let only = std::env::var("BENCH_ENGINES").ok();
    let engines: Vec<usize> = (0..ENGINES.len())
        .filter(|&e| only.as_deref().is_none_or(|o| o.split(',').any(|k| k == ENGINES[e].2)))
        .collect();
    assert!(!engines.is_empty(), "BENCH_ENGINES={only:?} names no engine (see the doc)");
    // On the project's disk (target/tmp), where fsync costs what it costs;
    // /tmp may be a tmpfs.
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("logstores");
    std::fs::create_dir_all(&base).unwrap();
    let mut runs: Vec<Vec<Rep>> = ENGINES.iter().map(|_| vec![]).collect();
    for rep in 0..reps {
        // The one-writer phases first, undisturbed by the concurrent ones (see `settle`).
        settle();
        let order: Vec<usize> = (0..engines.len()).map(|k| engines[(rep + k) % engines.len()]).collect();
        for &e in &order {
            eprintln!("rep {rep} {}: 1 writer × {appends}", ENGINES[e].1);
            let mut r = Rep::default();
            one_writer(ENGINES[e].0, &base, appends, &mut r);
            runs[e].push(r);
        }
        for &e in order.iter().filter(|_| seconds > 0.0) {
            eprintln!("rep {rep} {}: {WRITERS} writers × {seconds} s", ENGINES[e].1);
            concurrent(ENGINES[e].0, &base, seconds, runs[e].last_mut().unwrap());
        }
    }
    let (markdown, json) = results(&runs, &base, reps, appends, seconds);
    if let Some(only) = only {
        println!("\n{markdown}\n(BENCH_ENGINES={only}: a partial run, no results file written)");
    } else {
        report::write("logstores", "Raft log engines: redb vs raft-log vs raft-engine", &markdown, json);
    }
}

/// One number of a `Rep`.
type Get = fn(&Rep) -> Option<f64>;

/// The tables (Markdown) and the JSON of a run.
fn results(runs: &[Vec<Rep>], base: &Path, reps: usize, appends: u64, seconds: f64) -> (String, Value) {
    let spread = |e: usize, get: Get| -> Option<Spread> {
        let v: Option<Vec<f64>> = runs[e].iter().map(get).collect();
        v.filter(|v| !v.is_empty()).map(|v| Spread::of(&v))
    };
    // A ratio of medians, engine `e` over engine `of`.
    let ratio = |e: usize, of: usize, get: Get| {
        spread(e, get).zip(spread(of, get)).map_or("–".into(), |(a, b)| format!("{:.2}", a.median / b.median))
    };
    let show = |s: Option<Spread>, digits: usize| s.map_or("–".into(), |s| s.show(digits));
    let (raw, redb) = (0, 2);
    let measured: Vec<usize> = (0..ENGINES.len()).filter(|&e| !runs[e].is_empty()).collect();

    let mut one =
        Table::new(&["engine", "p50 µs", "p99 µs", "mean µs", "p50 ÷ redb", "mean ÷ redb", "mean ÷ raw floor"]);
    let mut many = Table::new(&[
        "engine",
        "appends/s",
        "fsyncs/s",
        "appends per fsync",
        "p99 µs",
        "appends/s ÷ redb",
        "appends/s ÷ raw floor",
    ]);
    // Each number of a `Rep`, in the order of the tables' columns.
    let get: [Get; 7] = [
        |r| r.p50_us,
        |r| r.p99_us,
        |r| r.mean_us,
        |r| r.appends_per_s,
        |r| r.fsyncs_per_s,
        |r| r.per_fsync,
        |r| r.concurrent_p99_us,
    ];
    for &e in &measured {
        let label = ENGINES[e].1.to_string();
        let s = |i: usize, digits| show(spread(e, get[i]), digits);
        // A row where the engine went through the phase.
        if spread(e, get[0]).is_some() {
            one.row(&[
                label.clone(),
                s(0, 0),
                s(1, 0),
                s(2, 0),
                ratio(e, redb, get[0]),
                ratio(e, redb, get[2]),
                ratio(e, raw, get[2]),
            ]);
        }
        if spread(e, get[3]).is_some() {
            many.row(&[label, s(3, 0), s(4, 0), s(5, 1), s(6, 0), ratio(e, redb, get[3]), ratio(e, raw, get[3])]);
        }
    }

    // The JSON: {"reps", "appends", "seconds", "writers", "payload_bytes", "engines": [keys],
    //   "one_writer": {"p50_us": M, "p99_us": M, "mean_us": M},
    //   "concurrent": {"appends_per_s": M, "fsyncs_per_s": M, "appends_per_fsync": M, "p99_us": M}}
    // where every M is {"raw": Spread, "raw_appended": ..., "redb": ..., "raft_log": ..., "raft_engine": ...,
    // "raft_engine_one_group": ...} (null where not measured) and a Spread is {"median", "min", "max"} over
    // the repetitions.
    let m = |i: usize| -> Value {
        Value::Object(
            ENGINES.iter().enumerate().map(|(e, (_, _, key))| (key.to_string(), json!(spread(e, get[i])))).collect(),
        )
    };
    let json = json!({
        "reps": reps,
        "appends": appends,
        "seconds": seconds,
        "writers": WRITERS,
        "payload_bytes": PAYLOAD_BYTES,
        "engines": measured.iter().map(|&e| ENGINES[e].2).collect::<Vec<_>>(),
        "one_writer": {"p50_us": m(0), "p99_us": m(1), "mean_us": m(2)},
        "concurrent": {"appends_per_s": m(3), "fsyncs_per_s": m(4), "appends_per_fsync": m(5), "p99_us": m(6)},
    });
    let concurrent = if seconds > 0.0 {
        format!(
            "**{WRITERS} writers** for {seconds} s, each appending one entry at a time. raw files, redb and \
             raft-log: through one writer thread, as fencegate's redb log store had: it takes every append \
             queued while its last commit ran (at most 4096) and commits them together, so fsyncs/s are its \
             commits. raft-engine: every writer calls `Engine::write` itself, each for a Raft group of its own; \
             its write barrier groups them (one fsync per group: its sync counter); raft-engine, one group: \
             one Raft log, through the writer thread like redb (a batch is one `LogBatch`). \
             Latency: from the writer's call to its durable answer.\n\n{}\n",
            many.markdown()
        )
    } else {
        String::new()
    };
    let markdown = format!(
        "Each engine in a new directory on {} per phase, entries of {PAYLOAD_BYTES} bytes (openraft's JSON of a \
         lock command's entry, as fencegate stores it), every append durable before it is answered. raw file, \
         preallocated: the bytes written (`pwrite`) into a 16 MiB file of zeros made durable beforehand, from \
         its start again when full, then `fdatasync`: only data to flush, the disk's floor. raw file, appended: \
         the same at the end of a growing file (`O_APPEND`), so each `fdatasync` also journals the new size. \
         redb 4 as fencegate used it (data formats 1–4): a batch is one write transaction (table \
         `logs: u64 -> &[u8]`) committed with `Durability::Immediate`. raft-log 0.4.6 configured as fencegate's \
         log from data format 5 (8 MiB chunks, a 4096-entry cache, `flush_batch_wait` 0, not its default 1 ms): \
         `append`, then `flush(true, callback)` and wait for the callback. raft-engine 0.4.2 (defaults, no \
         `scripting`): \
         entries through its entry API (`LogBatch::add_entries`, each a protobuf `BytesValue` of the index and \
         the bytes), `Engine::write(batch, sync = true)`.\n\n\
         **One writer**, {appends} appends one after another (after 20 not counted); the latency of each \
         engine call:\n\n{}\n{concurrent}\
         BENCH_REPS={reps}; engines in an order rotating every repetition, all one-writer phases first, \
         after a `sync` and a {}-second pause; median (min–max) over the repetitions; the ratios are of the \
         medians.\n",
        filesystem(base),
        one.markdown(),
        SETTLE.as_secs(),
    );
    (markdown, json)
}

/// "/dev/vda (ext4)": the device and file system `dir` is on, from `df`.
fn filesystem(dir: &Path) -> String {
    let out = std::process::Command::new("df").args(["--output=source,fstype"]).arg(dir).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    match text.lines().nth(1).map(|l| l.split_whitespace().collect::<Vec<_>>()).as_deref() {
        Some([source, fstype]) => format!("{source} ({fstype})"),
        _ => "the project's disk".into(),
    }
}
