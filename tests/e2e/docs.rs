//! The config examples in the docs are the shipped files, never copies made
//! by hand.
//!
//! A doc (`README.md`, `ARCHITECTURE.md`, `docs/**/*.md`) shows a config
//! file by a marker followed by a fenced code block:
//!
//! ```text
//! <!-- include: config/sidecar.yaml -->             the whole file
//! <!-- include: config/sidecar.yaml lines 15-24 --> those lines, 1-based, inclusive
//! ```
//!
//! The block must be byte-identical to the file, or to those lines. And
//! every file under `config/examples/` must pass `fencegate check-config`,
//! the real validator. Std only.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Examples that name files only a deployment has (TLS certificates): the
/// validator must get as far as loading the first of them, so every field
/// before that is checked. `.ci/deploy` can check them whole against a
/// throw-away PKI.
const NEEDS_FILES: &[(&str, &str)] = &[("node-tls.yaml", "`tls.cert`")];

/// `README.md`, `ARCHITECTURE.md` and every `.md` under `docs/`.
fn docs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![Path::new(ROOT).join("README.md"), Path::new(ROOT).join("ARCHITECTURE.md")];
    walk(&Path::new(ROOT).join("docs"), &mut out);
    out.sort();
    out
}

/// What an include marker asks for: the file's text, or some of its lines.
fn wanted(spec: &str) -> Result<String, String> {
    let (file, range) = match spec.split_once(" lines ") {
        Some((file, range)) => (file, Some(range)),
        None => (spec, None),
    };
    let text = std::fs::read_to_string(Path::new(ROOT).join(file)).map_err(|e| format!("{file}: {e}"))?;
    let Some(range) = range else { return Ok(text) };
    let bad = || format!("`lines {range}`: want `lines A-B` with 1 <= A <= B <= the file's length");
    let (a, b) = range.split_once('-').ok_or_else(bad)?;
    let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    let lines: Vec<&str> = text.lines().collect();
    if a == 0 || a > b || b > lines.len() {
        return Err(bad());
    }
    Ok(lines[a - 1..b].iter().map(|l| format!("{l}\n")).collect())
}

/// Every include marker of `text` whose block is not what it names.
fn mismatches(doc: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut problems = vec![];
    for (i, line) in lines.iter().enumerate() {
        let Some(spec) = line.trim().strip_prefix("<!-- include:").and_then(|s| s.strip_suffix("-->")) else {
            continue;
        };
        let spec = spec.trim();
        let at = format!("{doc}:{}: include {spec}", i + 1);
        if !lines.get(i + 1).is_some_and(|l| l.starts_with("```")) {
            problems.push(format!("{at}: no fenced code block right after the marker"));
            continue;
        }
        let Some(len) = lines[i + 2..].iter().position(|l| l.starts_with("```")) else {
            problems.push(format!("{at}: the code block never ends"));
            continue;
        };
        let shown: String = lines[i + 2..i + 2 + len].iter().map(|l| format!("{l}\n")).collect();
        match wanted(spec) {
            Err(e) => problems.push(format!("{at}: {e}")),
            Ok(want) if want != shown => {
                let first = want.lines().zip(shown.lines()).position(|(w, s)| w != s);
                problems.push(match first {
                    Some(n) => format!("{at}: differs from the file at the block's line {}", n + 1),
                    None => format!(
                        "{at}: the block has {} lines, the file {}",
                        shown.lines().count(),
                        want.lines().count()
                    ),
                });
            }
            Ok(_) => {}
        }
    }
    problems
}

#[test]
fn included_config_examples_are_the_shipped_files() {
    let mut problems = vec![];
    let mut includes = 0;
    for path in docs() {
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = path.strip_prefix(ROOT).unwrap().display().to_string();
        includes += text.lines().filter(|l| l.trim().starts_with("<!-- include:")).count();
        problems.extend(mismatches(&doc, &text));
    }
    assert!(problems.is_empty(), "{} include(s) out of date:\n{}", problems.len(), problems.join("\n"));
    assert!(includes > 0, "no include markers found: is the walk looking in the right place?");
}

#[test]
fn a_copied_block_that_drifted_is_caught() {
    let doc = "<!-- include: config/sidecar.yaml lines 1-2 -->\n```yaml\n# not the file\n```\n";
    assert_eq!(mismatches("t.md", doc).len(), 1);
    let doc = "<!-- include: config/nonexistent.yaml -->\n```yaml\n```\n<!-- include: config/sidecar.yaml -->\ntext\n";
    assert_eq!(mismatches("t.md", doc).len(), 2);
}

#[test]
fn every_config_example_passes_check_config() {
    let dir = Path::new(ROOT).join("config/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no files in {}", dir.display());
    let mut problems = vec![];
    for file in files {
        let out = Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .arg("check-config")
            .arg(&file)
            .env("FENCEGATE_LOG", "warn")
            .output()
            .unwrap();
        let (name, stderr) = (file.file_name().unwrap().to_str().unwrap(), String::from_utf8_lossy(&out.stderr));
        let ok = match NEEDS_FILES.iter().find(|(n, _)| *n == name) {
            None => out.status.success(),
            Some((_, field)) => {
                out.status.code() == Some(64) && stderr.contains(field) && stderr.contains("cannot read")
            }
        };
        if !ok {
            problems.push(format!("{}: {:?}: {stderr}", file.display(), out.status.code()));
        }
    }
    assert!(problems.is_empty(), "check-config:\n{}", problems.join("\n"));
}
