//! The Lock API as a node reads it, before anything is proposed: a leader
//! call's method and path (`inputs::call`: the key percent-decoded once and
//! checked, the lease id's form), an acquire's body (`http::parse_json`,
//! then `inputs::acquire_params` against the default lease limits), a
//! watch's query (`inputs::watch_params`) and a member to add (`AddMember`,
//! then `inputs::member_of`, plain and with TLS).
//!
//! Input: a letter saying which, then the bytes: `c` `METHOD PATH[?QUERY]`,
//! `a` an acquire body, `w` a watch query, `m` a member body.
//!
//! Beyond not panicking:
//! - a key taken from a path is a valid key, and decoding is done once: the
//!   key written plainly in the path is the same key (the key's alphabet
//!   has no `%`); a watch prefix likewise;
//! - an accepted acquire is within the limits, and the body written back
//!   from it (the client's `AcquireRequest`) is accepted as the same.
#![no_main]

use std::sync::LazyLock;

use fencegate::fuzzing::{
    inputs::{acquire_params, call, member_of, watch_params, Call},
    parse_json, validate, ConfigFile, LeaseConfig, NodeConfig,
};
use fencegate_client::wire::{AcquireRequest, AddMember, LOCKS_PATH};
use hyper::Method;
use libfuzzer_sys::fuzz_target;

/// The lease limits of a node configured with the defaults.
static LIMITS: LazyLock<LeaseConfig> = LazyLock::new(|| {
    let yaml = "id: 1\nlisten: 127.0.0.1:7401\npeer_listen: 127.0.0.1:7501\ndata_dir: /nonexistent\n\
                peers: { 1: http://127.0.0.1:7501 }\n";
    NodeConfig::from_yaml(yaml).expect("a node config").lease
});

fuzz_target!(|data: &[u8]| {
    let [what, rest @ ..] = data else { return };
    match what {
        b'c' => calls(rest),
        b'a' => acquire(rest),
        b'w' => watch(rest),
        b'm' => member(rest),
        _ => {}
    }
});

fn calls(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else { return };
    let Some((method, target)) = line.split_once(' ') else { return };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else { return };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let Ok(c) = call(&method, path, query) else { return };
    if let Call::Acquire(key) | Call::Read(key) = &c {
        assert_eq!(validate::key(key), Ok(()), "{path:?}");
        let plain = call(&method, &format!("{LOCKS_PATH}{key}"), query);
        assert_eq!(plain.ok().as_ref(), Some(&c), "{path:?} is {key:?}, but {key:?} is not");
    }
    if let Call::Keepalive(id) | Call::Release(id) = &c {
        assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{path:?}");
    }
}

fn acquire(body: &[u8]) {
    let Ok(request) = parse_json::<AcquireRequest>(body) else { return };
    let Ok(p) = acquire_params(request, &LIMITS) else { return };
    assert!((LIMITS.min_ttl.as_millis()..=LIMITS.max_ttl.as_millis()).contains(&(p.ttl_ms as u128)));
    assert!(p.wait_ms as u128 <= LIMITS.max_wait.as_millis());
    assert!(p.lock_delay_ms as u128 <= LIMITS.max_ttl.as_millis());
    assert_eq!(validate::holder(&p.holder), Ok(()));
    let again = AcquireRequest {
        ttl_ms: Some(p.ttl_ms),
        wait_ms: Some(p.wait_ms),
        holder: Some(p.holder.clone()),
        request_id: p.request_id.clone(),
        lock_delay_ms: Some(p.lock_delay_ms),
    };
    let json = serde_json::to_vec(&again).expect("wire types serialise");
    let back = parse_json::<AcquireRequest>(&json).expect("our own body");
    assert_eq!(acquire_params(back, &LIMITS).as_ref(), Ok(&p), "{}", String::from_utf8_lossy(&json));
}

fn watch(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else { return };
    let Ok(params) = watch_params(Some(query)) else { return };
    if !params.prefix.is_empty() {
        let plain = watch_params(Some(&format!("prefix={}", params.prefix))).expect("a decoded prefix, plainly");
        assert_eq!(plain.prefix, params.prefix, "{query:?}");
    }
}

fn member(body: &[u8]) {
    let Ok(add) = parse_json::<AddMember>(body) else { return };
    for tls in [false, true] {
        if let Ok(m) = member_of(&add, tls) {
            assert!(add.id != 0);
            assert!(!m.peer_url.is_empty() && !m.peer_url.ends_with('/'), "{m:?}");
        }
    }
}
