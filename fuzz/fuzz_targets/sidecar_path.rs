//! The sidecar's request path: `routes::canonical` and the route table's
//! `find` / `find_overridden`, on two tables written as users write them
//! (through `SidecarConfig::from_yaml`): one with untyped parameters and a
//! `{*rest}` key, one with only `int` and `slug` parameters.
//!
//! Input: a method letter, an override letter (space: none), then the path
//! (see `method` for the letters).
//!
//! Beyond not panicking:
//! - canonicalisation is idempotent, and the trailing `/` changes nothing;
//! - an accepted path is a fixed point of what a lenient upstream does to a
//!   path (escapes of unreserved characters, `/`, `\` and `%` decoded, twice;
//!   `\` read as `/`; `;params` dropped; empty and dot segments resolved), so
//!   the upstream serves the path the sidecar matched;
//! - on the typed table, ASCII case changes nothing (literals ignore case,
//!   `int` and `slug` values have one spelling);
//! - a path with sub-delimiters, `:` or `@` percent-encoded is the same path
//!   to an upstream that decodes them: if the sidecar forwards a write on
//!   one spelling unfenced, it must not fence the other, and if it forwards
//!   both, it does so under the same route and lock key.
#![no_main]

use std::sync::LazyLock;

use fencegate::fuzzing::{canonical, hex_byte, ConfigFile, MatchError, Matched, Routes, SidecarConfig};
use hyper::Method;
use libfuzzer_sys::fuzz_target;

const HEAD: &str = "
kind: sidecar
listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
lock_service: { endpoints: [http://127.0.0.1:7401] }
state_dir: /nonexistent
routes:
";

const UNTYPED: &str = "
  - { name: rack-writes, methods: [PUT, POST, PATCH, DELETE], path: '/racks/{rack}', lock_key: 'rack/{rack}',
      allow_method_override: true }
  - { name: slots, path: '/racks/{rack}/slots/{slot}', lock_key: 'rack/{rack}/slot/{slot}' }
  - { name: files, methods: [PUT], path: '/files/{*file}', lock_key: 'files/{file}', suffixes: [json] }
  - { name: batch, methods: [POST], path: '/v1/items:batch', lock_key: items }
  - { name: spaced, path: '/a%20b/{id}', lock_key: 'spaced/{id}' }
  - { name: reads, methods: [GET, HEAD], path: '/{*rest}', fence: off }
  - { name: rest, path: '/{*rest}', fence: off }
";

const TYPED: &str = "
  - { name: hosts, path: '/hosts/{name:slug}', lock_key: 'host/{name}', suffixes: [json, xml],
      allow_method_override: true }
  - { name: racks, methods: [PUT, POST, PATCH, DELETE], path: '/racks/{rack:int}/{*rest}', lock_key: 'rack/{rack}',
      suffixes: [json] }
  - { name: batch, methods: [POST], path: '/v1/items:batch/{n:int}', lock_key: 'items/{n}' }
  - { name: any, path: '/{*rest}', fence: off }
";

static TABLES: LazyLock<[Routes; 2]> = LazyLock::new(|| {
    [UNTYPED, TYPED].map(|routes| SidecarConfig::from_yaml(&format!("{HEAD}{routes}")).expect("the table").routes)
});

fn method(letter: u8) -> Option<Method> {
    Some(match letter {
        b'G' => Method::GET,
        b'H' => Method::HEAD,
        b'P' => Method::PUT,
        b'O' => Method::POST,
        b'A' => Method::PATCH,
        b'D' => Method::DELETE,
        b'X' => Method::OPTIONS,
        b'T' => Method::TRACE,
        b'U' => Method::from_bytes(b"PURGE").ok()?,
        b'M' => Method::from_bytes(b"MOVE").ok()?,
        _ => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    let [m, o, path @ ..] = data else { return };
    let (Some(m), Ok(path)) = (method(*m), std::str::from_utf8(path)) else { return };
    let effective = method(*o);

    let body = canonical(path);
    if let Ok(body) = body {
        assert_eq!(canonical(&format!("/{body}")), Ok(body), "not idempotent: {path:?}");
        if !body.is_empty() {
            assert_eq!(canonical(&format!("/{body}/")), Ok(body), "{path:?}");
        }
        assert_eq!(lenient(path), format!("/{body}"), "a lenient upstream reads {path:?} as another path");
    }

    for (typed, table) in TABLES.iter().enumerate() {
        let got = table.find(&m, path);
        assert_eq!(matches!(got, Err(MatchError::MalformedPath(_))), body.is_err(), "{m} {path:?}: {got:?}");
        if let Some(e) = &effective {
            let _ = table.find_overridden(&m, e, path);
        }
        let Ok(body) = body else { continue };
        // `//` is not the root with a trailing slash: an empty segment.
        let slashed = (!body.is_empty()).then(|| format!("/{body}/"));
        for same in std::iter::once(format!("/{body}")).chain(slashed) {
            assert_eq!(summary(&table.find(&m, &same)), summary(&got), "{m} {path:?} vs {same:?}");
        }
        if typed == 1 {
            let swapped: String = path
                .chars()
                .map(|c| if c.is_ascii_lowercase() { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() })
                .collect();
            let other = table.find(&m, &swapped);
            assert_eq!(summary(&other), summary(&got), "{m} {path:?} vs {swapped:?}");
        }
        let decoded = decode_where(path, |v| b"!$&'()*+,=:@".contains(&v));
        if decoded != path {
            same_write(table, &m, path, &got, &decoded, &table.find(&m, &decoded));
        }
    }
});

/// What a request gets, without the messages (which quote the path).
fn summary(r: &Result<Matched<'_>, MatchError>) -> String {
    match r {
        Ok(m) => format!("{} {:?}", m.route.name, m.key),
        Err(MatchError::MalformedPath(_)) => "malformed".into(),
        Err(MatchError::InvalidKey { route, .. }) => format!("invalid key on {route}"),
        Err(MatchError::BadParam { route, .. }) => format!("bad param on {route}"),
        Err(MatchError::UnfencedWrite { through, fenced, .. }) => {
            format!("unfenced write through {through} ({fenced})")
        }
        Err(MatchError::MethodOverride { .. }) => "override".into(),
        Err(MatchError::NoRoute) => "no route".into(),
    }
}

/// Whether the answer says the path is a fenced route's (forwarded fenced,
/// or refused for being one).
fn fenced(table: &Routes, r: &Result<Matched<'_>, MatchError>) -> bool {
    let is_fenced = |name: &str| table.iter().any(|route| route.name == name && route.lock_key().is_some());
    match r {
        Ok(m) => m.key.is_some(),
        Err(MatchError::UnfencedWrite { .. }) => true,
        Err(MatchError::InvalidKey { route, .. } | MatchError::BadParam { route, .. }) => is_fenced(route),
        Err(_) => false,
    }
}

/// Two spellings of one resource: a write forwarded unfenced on one is not
/// fenced on the other; forwarded on both, it takes one route and key.
fn same_write(
    table: &Routes,
    m: &Method,
    a: &str,
    ra: &Result<Matched<'_>, MatchError>,
    b: &str,
    rb: &Result<Matched<'_>, MatchError>,
) {
    let safe = matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE);
    match (ra, rb) {
        (Ok(x), Ok(y)) => {
            assert_eq!((&x.route.name, &x.key), (&y.route.name, &y.key), "{m} {a:?} vs {b:?}")
        }
        (Ok(x), other) | (other, Ok(x)) if !safe && x.key.is_none() => {
            assert!(
                !fenced(table, other),
                "{m} {a:?} vs {b:?}: one forwarded unfenced ({}), the other {other:?}",
                x.route.name
            )
        }
        _ => {}
    }
}

/// Percent-decode the escapes of the bytes `which` picks (ASCII only, so
/// the result is UTF-8 as the input was).
fn decode_where(s: &str, which: impl Fn(u8) -> bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match hex_byte(b.get(i + 1..i + 3)) {
            Some(v) if b[i] == b'%' && v.is_ascii() && which(v) => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("ASCII replaced by ASCII")
}

/// What a lenient upstream makes of a path (see the module's doc).
fn lenient(path: &str) -> String {
    let loose = |v: u8| v.is_ascii_alphanumeric() || b"-._~/\\%".contains(&v);
    let decoded = decode_where(&decode_where(path, loose), loose).replace('\\', "/");
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/').map(|s| s.split(';').next().unwrap_or("")) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}
