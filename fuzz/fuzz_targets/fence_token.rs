//! The sidecar's request headers that carry a client's claims: `X-Fence-Token`
//! (`fence::parse_token`, S6) and `Idempotency-Key` (`idempotency::parse_key`).
//!
//! Input: header values separated by `\n`, as many `X-Fence-Token` lines as
//! there are (values hyper would refuse are dropped, as on the wire). The
//! same values are given to `Idempotency-Key`.
//!
//! Beyond not panicking: a token is accepted only from exactly one value,
//! and only in its one spelling (the value is the token's decimal form), so
//! no two values the upstream could tell apart carry the same token; and
//! every plain decimal u64 is accepted. An accepted idempotency key is 1 to
//! 255 visible ASCII characters and is the value, or the value unquoted.
#![no_main]

use fencegate::fuzzing::{
    idempotency::{self, parse_key},
    parse_token, Reason,
};
use fencegate_client::wire::TOKEN_HEADER;
use hyper::header::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let values: Vec<HeaderValue> =
        data.split(|&b| b == b'\n').filter_map(|v| HeaderValue::from_bytes(v).ok()).take(8).collect();
    let mut tokens = HeaderMap::new();
    let mut keys = HeaderMap::new();
    for v in &values {
        tokens.append(TOKEN_HEADER, v.clone());
        keys.append(idempotency::HEADER, v.clone());
    }

    match parse_token(&tokens) {
        Ok(None) => assert!(values.is_empty(), "no token from {values:?}"),
        Ok(Some(token)) => {
            assert_eq!(values.len(), 1, "one token from several headers {values:?}");
            assert_eq!(values[0].as_bytes(), token.to_string().as_bytes(), "a second spelling of {token}");
        }
        Err(reason) => {
            assert_eq!(reason, Reason::MalformedToken);
            if let [v] = values.as_slice() {
                let canonical = std::str::from_utf8(v.as_bytes())
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .is_some_and(|t| t.to_string().as_bytes() == v.as_bytes());
                assert!(!canonical, "refused the plain token {v:?}");
            }
        }
    }

    match parse_key(&keys) {
        Ok(None) => assert!(values.is_empty()),
        Ok(Some(key)) => {
            assert_eq!(values.len(), 1);
            let raw = values[0].as_bytes();
            let quoted = raw.len() >= 2 && raw[0] == b'"' && raw[raw.len() - 1] == b'"';
            let inner = if quoted { &raw[1..raw.len() - 1] } else { raw };
            assert_eq!(key.as_bytes(), inner);
            assert!((1..=idempotency::MAX_KEY_LEN).contains(&key.len()));
            assert!(key.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'), "{key:?}");
        }
        Err(_) => {}
    }
});
