//! An idempotency record's bytes in the journal. Pure.
//!
//! State format 3 writes a record as fields with their lengths, then the
//! answer's body:
//!
//! ```text
//! [u32 MAX][u64 token][u64 created_ms][u64 expires_ms][route][fingerprint]
//! [u8 state: 0 pending | 1 unknown, [why] | 2 done, [u16 status][u8 kept][u32 n] n × ([name][value])]
//! [body: the rest]
//! ```
//!
//! little-endian, each string or byte field as `[u32 length][bytes]`.
//! Formats 1 and 2 wrote `[u32 length][JSON metadata][body]`; those are
//! still read (a JSON length is never `u32::MAX`). Format 3 is plain copies
//! where the JSON cost escaping: on a keyed request a record is written
//! twice (pending, then answered), and the JSON was an eighth of the
//! request's instructions (`bench/JOURNAL.md`, issue 13).

use bytes::Bytes;
use serde::Deserialize;

use crate::sidecar::idempotency::{Record, State};

/// Where a JSON record has its metadata's length.
const BINARY: u32 = u32::MAX;

const PENDING: u8 = 0;
const UNKNOWN: u8 = 1;
const DONE: u8 = 2;

impl Record {
    /// Format 3's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let field = |b: &[u8]| 4 + b.len();
        let state = match &self.state {
            State::Pending => 0,
            State::Unknown { why } => field(why.as_bytes()),
            State::Done { headers, .. } => {
                7 + headers.iter().map(|(k, v)| field(k.as_bytes()) + field(v)).sum::<usize>()
            }
        };
        let size = 29 + field(self.route.as_bytes()) + field(self.fingerprint.as_bytes()) + state + self.body.len();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&BINARY.to_le_bytes());
        for n in [self.token, self.created_ms, self.expires_ms] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        put(&mut out, self.route.as_bytes());
        put(&mut out, self.fingerprint.as_bytes());
        match &self.state {
            State::Pending => out.push(PENDING),
            State::Unknown { why } => {
                out.push(UNKNOWN);
                put(&mut out, why.as_bytes());
            }
            State::Done { status, headers, kept } => {
                out.push(DONE);
                out.extend_from_slice(&status.to_le_bytes());
                out.push(u8::from(*kept));
                out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
                for (name, value) in headers {
                    put(&mut out, name.as_bytes());
                    put(&mut out, value);
                }
            }
        }
        out.extend_from_slice(&self.body);
        debug_assert_eq!(out.len(), size);
        out
    }

    /// A record of any format this build reads.
    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        let mut r = Reader { bytes, at: 0 };
        let len = r.u32()?;
        if len != BINARY {
            return decode_json(bytes, len as usize);
        }
        let (token, created_ms, expires_ms) = (r.u64()?, r.u64()?, r.u64()?);
        let (route, fingerprint) = (r.string()?, r.string()?);
        let state = match r.u8()? {
            PENDING => State::Pending,
            UNKNOWN => State::Unknown { why: r.string()? },
            DONE => {
                let (status, kept) = (r.u16()?, r.u8()? != 0);
                let n = r.u32()? as usize;
                // Each header takes at least 8 bytes: a count past what is
                // left is damage, not a reason to reserve gigabytes.
                if n > (bytes.len() - r.at) / 8 {
                    return Err(format!("a record of {n} headers in {} bytes", bytes.len() - r.at));
                }
                let mut headers = Vec::with_capacity(n);
                for _ in 0..n {
                    headers.push((r.string()?, r.field()?.to_vec()));
                }
                State::Done { status, headers, kept }
            }
            other => return Err(format!("a record in state {other}, which this build does not know")),
        };
        let body = Bytes::copy_from_slice(&bytes[r.at..]);
        Ok(Record { route, fingerprint, token, created_ms, expires_ms, state, body, reserve: 0 })
    }
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u32).to_le_bytes());
    out.extend_from_slice(field);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.bytes.len());
        let end = end.ok_or_else(|| format!("a record cut short at byte {} ({n} more wanted)", self.at))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    fn field(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let at = self.at;
        let field = self.field()?;
        String::from_utf8(field.to_vec()).map_err(|_| format!("a record's text at byte {at} is not UTF-8"))
    }
}

/// Formats 1 and 2: `[u32 length][JSON metadata][body]`.
fn decode_json(bytes: &[u8], len: usize) -> Result<Record, String> {
    let meta = bytes.get(4..4 + len).ok_or("a record shorter than its metadata")?;
    let m: Json = serde_json::from_slice(meta).map_err(|e| e.to_string())?;
    let state = match m.state {
        JsonState::Pending => State::Pending,
        JsonState::Unknown { why } => State::Unknown { why },
        JsonState::Done { status, headers, kept } => {
            let headers = headers.into_iter().map(|(name, v)| (name, v.into_bytes())).collect();
            State::Done { status, headers, kept }
        }
    };
    Ok(Record {
        route: m.route,
        fingerprint: m.fingerprint,
        token: m.token,
        created_ms: m.created_ms,
        expires_ms: m.expires_ms,
        state,
        body: Bytes::copy_from_slice(&bytes[4 + len..]),
        reserve: 0,
    })
}

#[derive(Deserialize)]
struct Json {
    route: String,
    fingerprint: String,
    token: u64,
    created_ms: u64,
    expires_ms: u64,
    state: JsonState,
}

#[derive(Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum JsonState {
    Pending,
    Unknown { why: String },
    Done { status: u16, headers: Vec<(String, JsonValue)>, kept: bool },
}

/// A header value: a string where it was UTF-8 (format 2), else an array
/// of bytes (format 1 wrote every value so).
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonValue {
    Text(String),
    Bytes(Vec<u8>),
}

impl JsonValue {
    fn into_bytes(self) -> Vec<u8> {
        match self {
            JsonValue::Text(t) => t.into_bytes(),
            JsonValue::Bytes(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sidecar::idempotency::sample;

    fn every_state() -> Vec<Record> {
        vec![
            sample(State::Pending),
            sample(State::Unknown { why: "cut \"mid\" answer".into() }),
            sample(State::Done {
                status: 201,
                headers: vec![("x".into(), vec![0, 255]), ("date".into(), b"Tue, 1 Dec".to_vec())],
                kept: true,
            }),
            sample(State::Done { status: 200, headers: vec![], kept: false }),
            Record::unreadable("bad".into(), 7, 10),
        ]
    }

    #[test]
    fn records_round_trip() {
        for r in every_state() {
            assert_eq!(Record::decode(&r.encode()), Ok(r.clone()), "{:?}", r.state);
        }
    }

    /// Every prefix of a record is refused, not read as a shorter one
    /// (but where the cut falls in the body, which has no length of its
    /// own: the journal's checksum covers that).
    #[test]
    fn a_record_cut_short_or_damaged_is_refused() {
        let r = &every_state()[2];
        let bytes = r.encode();
        let meta = bytes.len() - r.body.len();
        for cut in 0..meta {
            assert!(Record::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_state = bytes.clone();
        bad_state[4 + 24 + 5 + 5] = 9;
        assert!(Record::decode(&bad_state).unwrap_err().contains("state 9"));
        let mut many = sample(State::Done { status: 200, headers: vec![], kept: true }).encode();
        let n = many.len() - 13 - 4;
        many[n..n + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Record::decode(&many).unwrap_err().contains("headers"), "a count past the bytes");
        let mut not_utf8 = sample(State::Pending).encode();
        not_utf8[4 + 24 + 4] = 0xff;
        assert!(Record::decode(&not_utf8).unwrap_err().contains("UTF-8"));
    }

    /// What builds before wrote: JSON metadata, header values as arrays of
    /// bytes (format 1) or as strings (format 2).
    #[test]
    fn records_of_formats_1_and_2_are_read() {
        let framed = |json: &[u8], body: &[u8]| {
            let mut b = (json.len() as u32).to_le_bytes().to_vec();
            b.extend_from_slice(json);
            b.extend_from_slice(body);
            b
        };
        let one = br#"{"route":"r","fingerprint":"f","token":5,"created_ms":1,"expires_ms":2,"state":{"state":"done","status":200,"headers":[["date",[84,117,101]]],"kept":true}}"#;
        let read = Record::decode(&framed(one, b"made")).unwrap();
        assert_eq!(
            read.state,
            State::Done { status: 200, headers: vec![("date".into(), b"Tue".to_vec())], kept: true }
        );
        assert_eq!((&read.body[..], read.token, read.created_ms, read.expires_ms), (&b"made"[..], 5, 1, 2));
        let two = br#"{"route":"r","fingerprint":"f","token":5,"created_ms":1,"expires_ms":2,"state":{"state":"done","status":201,"headers":[["x",[0,255]],["date","Tue"]],"kept":true}}"#;
        let read = Record::decode(&framed(two, b"")).unwrap();
        let headers = vec![("x".into(), vec![0, 255]), ("date".into(), b"Tue".to_vec())];
        assert_eq!(read.state, State::Done { status: 201, headers, kept: true });
        let unknown = br#"{"route":"r","fingerprint":"","token":0,"created_ms":1,"expires_ms":2,"state":{"state":"unknown","why":"cut"}}"#;
        assert_eq!(Record::decode(&framed(unknown, b"")).unwrap().state, State::Unknown { why: "cut".into() });
        assert!(Record::decode(b"\x09\0\0\0{}").is_err());
        assert!(Record::decode(b"\x02\0\0\0{}").is_err(), "JSON missing its fields");
    }
}
