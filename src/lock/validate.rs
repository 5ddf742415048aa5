//! Input limits for the lock API, checked before anything is proposed so that
//! bad input changes no state.
//!
//! Knows no config: the bounds that are configurable (TTLs, holder and key
//! lengths) are passed in.

use std::time::Duration;

use thiserror::Error;

pub const MAX_KEY_LEN: usize = 256;
pub const MAX_HOLDER_LEN: usize = 128;
pub const MAX_REQUEST_ID_LEN: usize = 64;
/// The shortest `lease.min_ttl` a node may be configured with: the API
/// counts TTLs in whole milliseconds, and a lease of 0 ms is none. No node
/// grants a shorter lease, whatever its config.
pub const MIN_TTL: Duration = Duration::from_millis(1);
/// The longest `lease.max_wait` a node may be configured with (a parked
/// acquire is an open connection). No node waits longer, whatever its config.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum InvalidInput {
    #[error("key must be 1..={MAX_KEY_LEN} bytes of [A-Za-z0-9._:-] segments (not . or ..) separated by single '/', got {0:?}")]
    Key(String),
    #[error("holder must be 1..={MAX_HOLDER_LEN} printable ASCII characters")]
    Holder,
    #[error("request_id must be 1..={MAX_REQUEST_ID_LEN} characters of [A-Za-z0-9_-]")]
    RequestId,
    #[error("ttl_ms {got} is outside [{min}, {max}]")]
    Ttl { got: u64, min: u64, max: u64 },
    #[error("{field} {got} exceeds the limit of {max}")]
    TooLarge { field: &'static str, got: u64, max: u64 },
}

/// Keys look like paths (`rack/42`): non-empty segments of a safe alphabet, so
/// that they can be templated from URL paths and printed in logs unescaped.
pub fn key(k: &str) -> Result<(), InvalidInput> {
    // `.` and `..` are not segments: a proxy in front that normalises paths
    // would read `rack/../fw/1` as another key.
    let segment_ok = |s: &[u8]| {
        !matches!(s, b"" | b"." | b"..")
            && s.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    };
    // Split as bytes: `str::split` sets up a searcher, costly on short segments.
    if k.is_empty() || k.len() > MAX_KEY_LEN || !k.as_bytes().split(|&b| b == b'/').all(segment_ok) {
        return Err(InvalidInput::Key(k.chars().take(MAX_KEY_LEN).collect()));
    }
    Ok(())
}

/// A key prefix (a watch's, a listing's): empty (every key), a key, or the
/// start of one whose last segment may be empty (`rack/`).
pub fn prefix(p: &str) -> Result<(), InvalidInput> {
    if p.is_empty() {
        return Ok(());
    }
    if p.len() > MAX_KEY_LEN {
        return Err(InvalidInput::Key(p.chars().take(MAX_KEY_LEN).collect()));
    }
    key(p.strip_suffix('/').unwrap_or(p))
}

pub fn holder(h: &str) -> Result<(), InvalidInput> {
    if h.is_empty() || h.len() > MAX_HOLDER_LEN || !h.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(InvalidInput::Holder);
    }
    Ok(())
}

pub fn request_id(r: &str) -> Result<(), InvalidInput> {
    if r.is_empty()
        || r.len() > MAX_REQUEST_ID_LEN
        || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(InvalidInput::RequestId);
    }
    Ok(())
}

pub fn ttl(got: u64, min: u64, max: u64) -> Result<(), InvalidInput> {
    if got < min || got > max {
        return Err(InvalidInput::Ttl { got, min, max });
    }
    Ok(())
}

pub fn at_most(field: &'static str, got: u64, max: u64) -> Result<(), InvalidInput> {
    if got > max {
        return Err(InvalidInput::TooLarge { field, got, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for ok in ["a", "rack/42", "dc-1/rack_2/slot:3", "a.b", "a/.b", "a/.../b"] {
            assert_eq!(key(ok), Ok(()), "{ok}");
        }
        let long = "x".repeat(MAX_KEY_LEN + 1);
        for bad in ["", "/a", "a/", "a//b", "a b", "ä", "a?b", "a%2Fb", ".", "a/../b", "a/./b", "..", long.as_str()] {
            assert!(key(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn holders_and_ids() {
        assert!(holder("bastion-2 (pid 7)").is_ok());
        assert!(holder("").is_err());
        assert!(holder("a\nb").is_err());
        assert!(request_id("abc-123_X").is_ok());
        assert!(request_id("a b").is_err());
        assert!(request_id(&"r".repeat(65)).is_err());
    }

    #[test]
    fn ttl_bounds() {
        assert!(ttl(500, 500, 1000).is_ok());
        assert!(ttl(1000, 500, 1000).is_ok());
        assert_eq!(ttl(499, 500, 1000), Err(InvalidInput::Ttl { got: 499, min: 500, max: 1000 }));
        assert!(ttl(1001, 500, 1000).is_err());
    }
}
