//! The fence decision: a pure function of the presented token, the route's
//! fence (`config::sidecar::Fence`, plain values) and what the sidecar
//! knows about the key. No clock, no IO, no config file; the caller (`sidecar::fencing`) fetches knowledge and asks
//! again when told to.
//!
//! `parse_token` is S6; `decide(mode, token, knowledge, fresh)` answers
//! `Forward`, `Reject` or `AskService`. A key whose service token is below
//! its floor is refused whatever the token (`behind_floor`: the lock
//! service's history went back, e.g. a restore).

use fencegate_client::wire::{Token, TOKEN_HEADER};
use hyper::header::{HeaderMap, HeaderName};

pub use fencegate_client::wire::Reason;

use crate::config::sidecar::FenceMode;

/// S6: exactly one `X-Fence-Token` header whose value is a plain decimal u64
/// (ASCII digits only: no sign, no spaces, no comma lists, no overflow).
/// `Ok(None)` when there is none.
pub fn parse_token(headers: &HeaderMap) -> Result<Option<Token>, Reason> {
    static NAME: HeaderName = HeaderName::from_static(TOKEN_HEADER);
    let mut values = headers.get_all(&NAME).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(Reason::MalformedToken);
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 20 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(Reason::MalformedToken);
    }
    // One spelling per token: `03` would reach the upstream as `03`, which
    // an upstream comparing strings or reading octal takes for another.
    if bytes.len() > 1 && bytes[0] == b'0' {
        return Err(Reason::MalformedToken);
    }
    std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()).map(Some).ok_or(Reason::MalformedToken)
}

/// What the sidecar knows about one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Knowledge {
    /// The latest grant of this key the sidecar has learnt of (0: none), from
    /// the watch stream or a linearizable read.
    pub latest: Token,
    /// Whether the lease of `latest` is known to be live. `false` once a
    /// release or expiry of it was seen.
    pub live: bool,
    /// Whether `latest`/`live` came from the lock service at all since start
    /// (after a restart with the service down, only the floor is known).
    pub known: bool,
    /// The highest token this sidecar has forwarded for the key (persisted).
    pub floor: Token,
    /// `live` is false only because a state dump did not list the key
    /// (compacted, or not visible to this sidecar's `watch` right): a
    /// linearizable read decides.
    pub presumed_ended: bool,
    /// Every token up to this of a key the lock service no longer has has
    /// ended (the highest `compacted_below` read so far).
    pub compacted_below: Token,
}

impl Knowledge {
    /// A linearizable read showed every grant up to `through` ended: the
    /// latest known grant stays ended whatever was learnt after the read (an
    /// older answer, from a slower member or a watch behind it, may say it
    /// is live).
    pub(crate) fn ended_through(&mut self, through: Token) {
        if self.latest <= through {
            (self.live, self.presumed_ended) = (false, false);
        }
    }
}

/// The verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Forward,
    Reject {
        reason: Reason,
        current: Token,
    },
    /// The knowledge cannot decide: read the key from the lock service
    /// (linearizably) and decide again with `fresh = true`.
    AskService,
}

/// Decide for `token` presented on a fenced route in `mode`.
///
/// `fresh` says `k` was just read from the lock service after the request
/// arrived (a linearizable read), so a token above `k.latest` was never
/// granted for this key (S3).
pub(crate) fn decide(mode: FenceMode, token: Token, k: &Knowledge, fresh: bool) -> Verdict {
    let reject = |reason, current| Verdict::Reject { reason, current };
    if mode != FenceMode::Observed && behind_floor(k, fresh) {
        // The service's history is behind what this sidecar forwarded: it
        // cannot say who holds the key. Neither the token of the lease the
        // floor came from nor one of the service's is forwarded.
        return reject(Reason::LockServiceBehindFloor, k.latest);
    }
    // S2: never below what this sidecar already let through.
    if token < k.floor {
        return reject(Reason::StaleToken, k.floor.max(k.latest));
    }
    if mode == FenceMode::Observed {
        // Kleppmann's storage check: the token only has to keep up with the
        // highest one accepted so far (the floor).
        return Verdict::Forward;
    }
    if token == 0 {
        // The lock service's first token is 1.
        return reject(Reason::UnknownToken, k.latest);
    }
    if token < k.latest {
        return reject(Reason::StaleToken, k.latest);
    }
    if token == k.latest && k.known {
        if k.live || mode == FenceMode::Monotonic {
            return Verdict::Forward;
        }
        if k.presumed_ended && !fresh {
            return Verdict::AskService;
        }
        // S4: strict refuses a lease known to have ended.
        return reject(Reason::LeaseExpired, k.latest);
    }
    if fresh {
        // The service says the latest grant is below `token`: never granted
        // for this key — unless the service forgot the key, and the token
        // is one it may have had (then it is stale: a later grant may have
        // been forgotten with it; monotonic routes too, since only the
        // latest grant passes them).
        if k.latest == 0 && token <= k.compacted_below {
            return reject(Reason::StaleToken, k.compacted_below);
        }
        return reject(Reason::UnknownToken, k.latest);
    }
    Verdict::AskService
}

/// Whether what the lock service says of the key is below the key's floor,
/// the highest token this sidecar forwarded for it. Within one history
/// that cannot be (a forwarded token was the key's latest grant, and the
/// latest only grows; a forgotten key's tokens are all at most
/// `compacted_below`); it means the service's history is not the one the
/// floor was raised in. Judged only on what the service said: the watch's
/// knowledge of the key, or a read of it (`fresh`).
fn behind_floor(k: &Knowledge, fresh: bool) -> bool {
    if k.floor == 0 {
        return false;
    }
    match (k.known, fresh) {
        (true, _) => k.latest < k.floor,
        // The service has no entry for the key: forgotten up to `compacted_below`.
        (false, true) => k.latest == 0 && k.compacted_below < k.floor,
        (false, false) => false,
    }
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;
    use FenceMode::*;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(TOKEN_HEADER, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn token_header_parsing_is_strict() {
        assert_eq!(parse_token(&headers(&[])), Ok(None));
        assert_eq!(parse_token(&headers(&[b"34"])), Ok(Some(34)));
        assert_eq!(parse_token(&headers(&[b"18446744073709551615"])), Ok(Some(u64::MAX)));
        assert_eq!(parse_token(&headers(&[b"0"])), Ok(Some(0)), "0 is canonical (and refused as never granted)");
        for bad in [
            &b""[..],
            b"abc",
            b"-1",
            b"+1",
            b" 34",
            b"34 ",
            b"3 4",
            b"34,35",
            b"0x22",
            b"3.4",
            b"18446744073709551616",
            b"99999999999999999999",
            b"000000000000000000001",
            b"03",
            b"00",
        ] {
            assert_eq!(
                parse_token(&headers(&[bad])),
                Err(Reason::MalformedToken),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(parse_token(&headers(&[b"34", b"34"])), Err(Reason::MalformedToken), "duplicated header");
    }

    fn k(latest: Token, live: bool, floor: Token) -> Knowledge {
        Knowledge { latest, live, known: true, floor, ..Default::default() }
    }

    #[test]
    fn the_walkthrough() {
        // B holds 34, A (33) wakes up: refused in both lock-service modes.
        for mode in [Strict, Monotonic] {
            assert_eq!(decide(mode, 34, &k(34, true, 0), false), Verdict::Forward);
            let v = decide(mode, 33, &k(34, true, 34), false);
            assert_eq!(v, Verdict::Reject { reason: Reason::StaleToken, current: 34 });
        }
    }

    #[test]
    fn strict_refuses_an_ended_lease_before_anyone_else_acquires() {
        assert_eq!(
            decide(Strict, 33, &k(33, false, 33), false),
            Verdict::Reject { reason: Reason::LeaseExpired, current: 33 }
        );
        assert_eq!(decide(Monotonic, 33, &k(33, false, 33), false), Verdict::Forward);
    }

    #[test]
    fn unknown_high_tokens_are_checked_with_the_service() {
        assert_eq!(decide(Strict, 99, &k(34, true, 34), false), Verdict::AskService);
        assert_eq!(
            decide(Strict, 99, &k(34, true, 34), true),
            Verdict::Reject { reason: Reason::UnknownToken, current: 34 }
        );
        // Nothing known yet (sidecar just started): ask.
        assert_eq!(decide(Strict, 5, &Knowledge::default(), false), Verdict::AskService);
        let never = Knowledge { known: true, ..Default::default() };
        assert_eq!(decide(Strict, 0, &never, true), Verdict::Reject { reason: Reason::UnknownToken, current: 0 });
    }

    #[test]
    fn a_lease_presumed_ended_is_asked_about_and_a_compacted_token_is_stale() {
        let presumed = Knowledge { presumed_ended: true, ..k(34, false, 0) };
        assert_eq!(decide(Strict, 34, &presumed, false), Verdict::AskService);
        assert_eq!(decide(Strict, 34, &presumed, true), Verdict::Reject { reason: Reason::LeaseExpired, current: 34 });
        let forgotten = Knowledge { compacted_below: 50, ..k(0, false, 0) };
        assert_eq!(decide(Strict, 40, &forgotten, true), Verdict::Reject { reason: Reason::StaleToken, current: 50 });
        assert_eq!(
            decide(Monotonic, 40, &forgotten, true),
            Verdict::Reject { reason: Reason::StaleToken, current: 50 }
        );
        assert_eq!(decide(Strict, 51, &forgotten, true), Verdict::Reject { reason: Reason::UnknownToken, current: 0 });
    }

    #[test]
    fn the_persisted_floor_holds_without_the_service() {
        let restarted = Knowledge { latest: 0, live: false, known: false, floor: 40, ..Default::default() };
        assert_eq!(decide(Strict, 39, &restarted, false), Verdict::Reject { reason: Reason::StaleToken, current: 40 });
        assert_eq!(decide(Strict, 40, &restarted, false), Verdict::AskService, "strict must know the lease is live");
        // Monotonic too: the floor was the latest grant once, but a later
        // one may have come and gone (and been forgotten) since.
        assert_eq!(decide(Monotonic, 40, &restarted, false), Verdict::AskService);
        assert_eq!(decide(Monotonic, 41, &restarted, false), Verdict::AskService);
    }

    /// The old holder's token equals the floor; the key was granted to
    /// another since, who released it, and the service forgot the key: a
    /// monotonic route must not take the floor for the latest grant.
    #[test]
    fn monotonic_refuses_a_forgotten_key_s_old_token() {
        let read = Knowledge { latest: 0, known: false, floor: 40, compacted_below: 55, ..Default::default() };
        let stale = Verdict::Reject { reason: Reason::StaleToken, current: 55 };
        assert_eq!(decide(Monotonic, 40, &read, true), stale);
        assert_eq!(decide(Strict, 40, &read, true), stale);
    }

    /// After a restore (another history), the service's latest token for
    /// the key is below the floor: the old holder's token (at the floor)
    /// and the new holder's (below it) are both refused, with their own
    /// reason, until the service's tokens pass the floor.
    #[test]
    fn a_service_behind_the_floor_forwards_nothing() {
        let behind = Verdict::Reject { reason: Reason::LockServiceBehindFloor, current: 4 };
        let restored = Knowledge { latest: 4, live: true, known: true, floor: 5, ..Default::default() };
        for mode in [Strict, Monotonic] {
            assert_eq!(decide(mode, 5, &restored, false), behind, "the old holder's token");
            assert_eq!(decide(mode, 4, &restored, false), behind, "the new holder's token");
            assert_eq!(decide(mode, 4, &restored, true), behind);
        }
        // Forgotten by the service with a watermark below the floor: behind too.
        let read = Knowledge { floor: 5, compacted_below: 3, ..Default::default() };
        let behind_read = Verdict::Reject { reason: Reason::LockServiceBehindFloor, current: 0 };
        assert_eq!(decide(Strict, 5, &read, true), behind_read);
        assert_eq!(decide(Strict, 5, &read, false), Verdict::AskService, "only the service's word counts");
        // Once the service grants above the floor, fencing goes on as before.
        let passed = Knowledge { latest: 9, ..restored };
        assert_eq!(decide(Strict, 9, &passed, false), Verdict::Forward);
        assert_eq!(decide(Strict, 5, &passed, false), Verdict::Reject { reason: Reason::StaleToken, current: 9 });
        // Observed routes keep their own marks and know no service.
        assert_eq!(decide(Observed, 5, &restored, false), Verdict::Forward);
        // Within one history the floor never passes the latest grant.
        let normal = Knowledge { latest: 5, live: true, known: true, floor: 5, ..Default::default() };
        assert_eq!(decide(Strict, 5, &normal, false), Verdict::Forward);
    }

    #[test]
    fn observed_mode_keeps_a_high_water_mark() {
        let k = Knowledge { floor: 7, ..Default::default() };
        assert_eq!(decide(Observed, 6, &k, false), Verdict::Reject { reason: Reason::StaleToken, current: 7 });
        assert_eq!(decide(Observed, 7, &k, false), Verdict::Forward);
        assert_eq!(decide(Observed, 1000, &k, false), Verdict::Forward);
    }
}
