//! Idempotency keys (I1): for every key, the upstream applies the request at
//! most once while its record is kept. Pure: the `Idempotency-Key` header,
//! a request's fingerprint, records and their encoding, and what a request
//! with a key gets. `records.rs` keeps them; the sidecar runs the exchange.
//!
//! After draft-ietf-httpapi-idempotency-key-header and Stripe's API: the
//! first request's answer is kept and replayed to a retry with the same key
//! and the same request; the same key with another request is 422; a retry
//! while the first is in flight is 409. Where the first one's outcome is
//! unknown (the exchange broke after it may have reached the upstream, or
//! the sidecar died in between), a retry is never forwarded again by
//! itself: 409 `outcome_unknown`, until an operator resolves it.
//!
//! A record's `scope` is its holder: lock key, token, key and client
//! identity (`upgrade_scope` for format 4's records, which had none).

pub mod admin;
pub mod exchange;
pub mod record_bytes;
pub mod records;
pub mod sharded;

use bytes::Bytes;
use hyper::HeaderMap;

/// A route's `idempotency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A request without a key is refused (428).
    pub required: bool,
    /// How long a record is kept after its first request.
    pub retention: std::time::Duration,
    /// The largest answer body kept for replay.
    pub max_response: u64,
    /// The bytes of records one lock key may hold at most (`per_lock_key`),
    /// so that no holder fills the store for every other key.
    pub per_lock_key: u64,
}

/// The request header (the draft's name).
pub const HEADER: &str = "idempotency-key";
/// Set on a replayed answer.
pub const REPLAYED: &str = "idempotent-replayed";
/// Longest key accepted (a UUID is 36; the draft sets no bound).
pub const MAX_KEY_LEN: usize = 255;

/// The request's key: `None` without the header; `Err` for a key that is
/// empty, too long, not printable ASCII, or sent twice. Taken as the
/// draft's sf-string (`"abc"`) or as a bare value (`abc`, as Stripe's
/// clients send it); both spell the key `abc`.
pub fn parse_key(headers: &HeaderMap) -> Result<Option<String>, String> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err("more than one Idempotency-Key header".into());
    }
    let raw = value.as_bytes();
    let inner = match raw {
        [b'"', inner @ .., b'"'] => inner,
        _ => raw,
    };
    let printable = |b: &u8| (0x21..=0x7e).contains(b) && *b != b'"' && *b != b'\\';
    if inner.is_empty() || inner.len() > MAX_KEY_LEN || !inner.iter().all(printable) {
        return Err(format!(
            "an Idempotency-Key is 1 to {MAX_KEY_LEN} visible ASCII characters (no quotes, backslashes or spaces), optionally in double quotes"
        ));
    }
    Ok(Some(String::from_utf8(inner.to_vec()).expect("ASCII")))
}

/// Where a key is unique: the holder that sent it (the lock key it writes
/// under, the fence token it presented and, over mutual TLS, the client's
/// certificate name) and the key itself. A record answers only requests
/// of its own holder: another holder's request with the same key is
/// another operation, with its own record (DESIGN, "a stored answer goes
/// only to its holder"). `lock_key\ntoken\nkey[\nidentity]`: neither lock
/// keys nor keys hold a line break, so the fields never run into each
/// other, and an identity (last) may hold anything. On disk since state
/// format 5 (`upgrade_scope` reads the older `lock_key\nkey`).
pub fn scope(lock_key: &str, token: u64, key: &str, identity: Option<&str>) -> String {
    // Not `format!`: this is on every keyed request, and the formatting
    // machinery cost ten times the copy.
    let mut digits = [0u8; 20];
    let token = decimal(token, &mut digits);
    let identity_len = identity.map_or(0, |i| 1 + i.len());
    let mut scope = String::with_capacity(lock_key.len() + token.len() + key.len() + 2 + identity_len);
    scope.push_str(lock_key);
    scope.push('\n');
    scope.push_str(token);
    scope.push('\n');
    scope.push_str(key);
    if let Some(identity) = identity {
        scope.push('\n');
        scope.push_str(identity);
    }
    scope
}

/// `n` in decimal, written into the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("digits")
}

/// The lock key a scope is under (what its quota counts by).
pub fn lock_key_of(scope: &str) -> &str {
    scope.split_once('\n').map_or(scope, |(lock_key, _)| lock_key)
}

/// A scope of state formats 1 to 4 (`lock_key\nkey`, shared by every
/// holder) as this format spells it, under the token its record's first
/// request carried; `None` for a scope of this format. Such a record has
/// no client identity: a build before format 5 kept none.
pub fn upgrade_scope(scope: &str, token: u64) -> Option<String> {
    let (lock_key, key) = scope.split_once('\n')?;
    (!key.contains('\n')).then(|| self::scope(lock_key, token, key, None))
}

/// What makes two requests "the same request": method, path and query as
/// sent, `Content-Type`, and the body (SHA-256, hex).
pub fn fingerprint(method: &str, path_and_query: &str, content_type: Option<&[u8]>, body: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    // Each field with its length first, so no two requests share an input.
    for part in [method.as_bytes(), path_and_query.as_bytes(), content_type.unwrap_or(b"\0none"), body] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part);
    }
    let mut hex = [0; 64];
    hex::encode_to_slice(ctx.finish(), &mut hex).expect("64 digits for 32 bytes");
    String::from_utf8(hex.to_vec()).expect("hex digits")
}

/// A key's record (its bytes on disk: `record_bytes.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub route: String,
    pub fingerprint: String,
    /// The token the first request carried.
    pub token: u64,
    /// Unix milliseconds: when the first request came, and when the record
    /// is dropped.
    pub created_ms: u64,
    pub expires_ms: u64,
    pub state: State,
    /// The upstream's answer body (`Done` with `kept`).
    pub body: Bytes,
    /// Bytes held for the answer while pending (`max_response` and room for
    /// headers), so that a store admitting many requests cannot grow past
    /// its bound when they are answered. In memory only.
    pub reserve: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Forwarded by this process, no answer yet.
    Pending,
    /// It may or may not have been applied.
    Unknown { why: String },
    /// The upstream answered. `kept`: the whole answer is stored (its body
    /// was at most the route's `max_response`), so it can be replayed.
    Done { status: u16, headers: Vec<(String, Vec<u8>)>, kept: bool },
}

impl State {
    /// Pending, or its outcome unknown: an operator may have to say.
    pub fn is_open(&self) -> bool {
        matches!(self, State::Pending | State::Unknown { .. })
    }
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Unknown { .. } => "unknown",
            State::Done { .. } => "done",
        }
    }
}

impl Record {
    /// What it costs to keep (memory and disk, roughly), with its reserve.
    pub fn size(&self, scope: &str) -> u64 {
        let state = match &self.state {
            State::Done { headers, .. } => headers.iter().map(|(k, v)| k.len() + v.len() + 8).sum(),
            State::Unknown { why } => why.len(),
            State::Pending => 0,
        };
        (scope.len() + self.route.len() + self.fingerprint.len() + state + self.body.len() + 96) as u64 + self.reserve
    }

    /// What stands for a record that could not be read back: an outcome
    /// unknown for any request under its key, kept as long as any record.
    pub fn unreadable(why: String, now_ms: u64, max_retention_ms: u64) -> Record {
        Record {
            route: String::new(),
            fingerprint: String::new(),
            token: 0,
            created_ms: now_ms,
            expires_ms: now_ms.saturating_add(max_retention_ms),
            state: State::Unknown { why },
            body: Bytes::new(),
            reserve: 0,
        }
    }
}

/// What a request with a key gets, given the key's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No record: make one (pending) and forward.
    Forward,
    /// The same request, answered: its stored answer.
    Replay(Record),
    /// Another request under the same key: 422.
    Mismatch,
    /// The first one is still in flight here: 409.
    InFlight,
    /// The first one's outcome is not known: 409, never forwarded again.
    Unknown(Record),
    /// The first one was answered, but its answer was too large to keep: 409.
    NotKept(u16),
}

/// What a request with this fingerprint gets, given its key's record.
pub fn judge(record: Option<&Record>, fingerprint: &str) -> Verdict {
    let Some(r) = record else { return Verdict::Forward };
    // An unreadable record has no fingerprint: unknown for every request.
    if r.fingerprint != fingerprint && !r.fingerprint.is_empty() {
        return Verdict::Mismatch;
    }
    match &r.state {
        State::Pending => Verdict::InFlight,
        State::Unknown { .. } => Verdict::Unknown(r.clone()),
        State::Done { kept: true, .. } => Verdict::Replay(r.clone()),
        State::Done { status, kept: false, .. } => Verdict::NotKept(*status),
    }
}

/// A record in `state` with a body of text and bytes, for tests.
#[cfg(test)]
pub fn sample(state: State) -> Record {
    Record {
        route: "r".into(),
        fingerprint: "f".into(),
        token: 5,
        created_ms: 1,
        expires_ms: 2,
        state,
        body: Bytes::from_static(b"{\"ok\":1}\n\0\xff"),
        reserve: 0,
    }
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn key(values: &[&[u8]]) -> Result<Option<String>, String> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(HEADER, HeaderValue::from_bytes(v).unwrap());
        }
        parse_key(&h)
    }

    #[test]
    fn keys_are_sf_strings_or_bare_values() {
        assert_eq!(key(&[]), Ok(None));
        assert_eq!(key(&[b"\"8e03978e-40d5\""]), Ok(Some("8e03978e-40d5".into())));
        assert_eq!(key(&[b"8e03978e-40d5"]), Ok(Some("8e03978e-40d5".into())));
        let long = "k".repeat(MAX_KEY_LEN);
        assert_eq!(key(&[long.as_bytes()]), Ok(Some(long.clone())));
        for bad in
            [&b""[..], b"\"\"", b"a b", b"a\"b", b"a\\b", b"\"abc", &[b'k'; MAX_KEY_LEN + 1][..], "ключ".as_bytes()]
        {
            assert!(key(&[bad]).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(key(&[b"a", b"a"]).is_err(), "twice");
    }

    /// A record is its holder's: the same key under another token, or from
    /// another client, is another scope (another operation, another
    /// record); the same holder's retry is the same scope.
    #[test]
    fn a_scope_is_one_holders_key() {
        assert_eq!(scope("rack/1", 33, "drain-7", None), "rack/1\n33\ndrain-7");
        assert_eq!(scope("rack/1", 33, "drain-7", None), scope("rack/1", 33, "drain-7", None), "a retry");
        assert_ne!(scope("rack/1", 29, "drain-7", None), scope("rack/1", 33, "drain-7", None), "another holder");
        assert_ne!(scope("rack/1", 33, "drain-7", Some("a")), scope("rack/1", 33, "drain-7", Some("b")));
        assert_ne!(scope("rack/1", 33, "drain-7", None), scope("rack/1", 33, "drain-7", Some("")));
        assert_eq!(scope("r", 0, "k", Some("CN\nodd")), "r\n0\nk\nCN\nodd");
        assert_eq!(scope("r", u64::MAX, "k", None), format!("r\n{}\nk", u64::MAX));
        for s in [scope("rack/1", 33, "k", None), scope("rack/1", 3, "k", Some("x\ny"))] {
            assert_eq!(lock_key_of(&s), "rack/1");
            assert_eq!(upgrade_scope(&s, 1), None, "already this format's");
        }
        assert_eq!(upgrade_scope("rack/1\ndrain-7", 29).as_deref(), Some("rack/1\n29\ndrain-7"));
        assert_eq!(upgrade_scope("nothing", 29), None);
    }

    #[test]
    fn a_fingerprint_covers_method_path_type_and_body() {
        let base = fingerprint("PUT", "/racks/1", Some(b"application/json"), b"{}");
        assert_eq!(base, fingerprint("PUT", "/racks/1", Some(b"application/json"), b"{}"));
        // As every build before spelt it: records already kept still match.
        assert_eq!(base, "83e00a64a74363eb8a7014ff1793f57820a66785ac40c383a874eb9d421944cf");
        for other in [
            fingerprint("POST", "/racks/1", Some(b"application/json"), b"{}"),
            fingerprint("PUT", "/racks/01", Some(b"application/json"), b"{}"),
            fingerprint("PUT", "/racks/1?x", Some(b"application/json"), b"{}"),
            fingerprint("PUT", "/racks/1", None, b"{}"),
            fingerprint("PUT", "/racks/1", Some(b"application/json"), b"{ }"),
            // Lengths first: moving bytes between fields changes it.
            fingerprint("PUT", "/racks/1", Some(b"application/jso"), b"n{}"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn requests_are_judged_by_their_keys_record() {
        let done = sample(State::Done { status: 201, headers: vec![("x".into(), vec![0, 255])], kept: true });
        assert_eq!(judge(None, "f"), Verdict::Forward);
        assert_eq!(judge(Some(&done), "f"), Verdict::Replay(done.clone()));
        assert_eq!(judge(Some(&done), "g"), Verdict::Mismatch);
        let pending = sample(State::Pending);
        assert_eq!(judge(Some(&pending), "f"), Verdict::InFlight);
        assert_eq!(judge(Some(&pending), "g"), Verdict::Mismatch, "another request is refused whatever the state");
        let unknown = sample(State::Unknown { why: "cut".into() });
        assert_eq!(judge(Some(&unknown), "f"), Verdict::Unknown(unknown.clone()));
        let big = sample(State::Done { status: 200, headers: vec![], kept: false });
        assert_eq!(judge(Some(&big), "f"), Verdict::NotKept(200));
        let lost = Record::unreadable("bad".into(), 0, 10);
        assert_eq!(judge(Some(&lost), "any"), Verdict::Unknown(lost.clone()), "unknown for every request");
    }
}
