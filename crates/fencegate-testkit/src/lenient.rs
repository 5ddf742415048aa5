//! How a lenient web framework reads a request that reached it: the
//! reading the sidecar must never be more lenient than. Modelled on what
//! Express (with method-override), Rails, Spring and IIS do out of the box
//! or with a common middleware:
//!
//! - the method may be overridden by `X-HTTP-Method-Override`,
//!   `X-HTTP-Method`, `X-Method-Override` or a `_method` query parameter (any
//!   case), and is upper-cased;
//! - the path may be replaced by `X-Original-URL` or `X-Rewrite-URL`;
//! - the path is percent-decoded (twice), `\` read as `/`, `;params`,
//!   empty and `.` segments dropped, `..` resolved, and routed ignoring case;
//! - an id is read with `parseInt`: leading digits, the rest ignored
//!   (`042`, `42.json`, `42.0`, `42abc` are all 42);
//! - the token header is read with `parseInt` too (`03` is 3).

use crate::upstream::Seen;

/// A write as the lenient framework would apply it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The collection, lower case (`racks`).
    pub collection: String,
    pub id: u64,
    /// The token it reads, if any.
    pub token: Option<u64>,
}

/// What `seen` writes, read leniently: `None` for a read, or for a path
/// that is not `/<collection>/<id>`.
pub fn write_of(seen: &Seen) -> Option<Write> {
    let header = |name: &str| seen.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let query_method = seen.query.as_deref().and_then(|q| {
        q.split('&').find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.eq_ignore_ascii_case("_method").then(|| v.to_string())
        })
    });
    let method = ["x-http-method-override", "x-http-method", "x-method-override"]
        .iter()
        .find_map(|h| header(h))
        .or(query_method)
        .unwrap_or_else(|| seen.method.clone())
        .to_ascii_uppercase();
    if matches!(method.as_str(), "GET" | "HEAD" | "OPTIONS" | "TRACE") {
        return None;
    }
    let path = header("x-original-url").or_else(|| header("x-rewrite-url")).unwrap_or_else(|| seen.path.clone());
    let path = path.split(['?', '#']).next().unwrap_or("");
    let decoded = decode(&decode(path)).replace('\\', "/").to_ascii_lowercase();
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
    let [collection, id] = segments[..] else { return None };
    let token = seen.headers.get(fencegate_client::TOKEN_HEADER).and_then(|v| parse_int(v.to_str().ok()?.trim()));
    Some(Write { collection: collection.to_string(), id: parse_int(id)?, token })
}

/// JavaScript's `parseInt(s, 10)` for non-negative values: leading digits.
pub fn parse_int(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Percent-decode every valid escape; the rest is kept as it is.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match hex {
            Some(v) if b[i] == b'%' => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(method: &str, path: &str, query: Option<&str>, headers: &[(&'static str, &'static str)]) -> Seen {
        let mut h = hyper::HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, hyper::header::HeaderValue::from_static(v));
        }
        Seen {
            method: method.into(),
            path: path.into(),
            query: query.map(str::to_string),
            token: None,
            headers: h,
            body: String::new(),
            arrived_at: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn what_a_lenient_framework_makes_of_a_request() {
        let rack1 = |token| Some(Write { collection: "racks".into(), id: 1, token });
        for s in [
            seen("PUT", "/racks/1", None, &[]),
            seen("put", "/RACKS/01.json", None, &[]),
            seen("DELETE", "/racks/%2531", None, &[]),
            seen("PATCH", "//racks/./x/../1;v=2/", None, &[]),
            seen("GET", "/racks/1", None, &[("x-http-method-override", "put")]),
            seen("GET", "/racks/1", Some("a=b&_METHOD=delete"), &[]),
            seen("POST", "/other", None, &[("x-original-url", "/racks/1?x")]),
            seen("PURGE", "/racks\\1.0", None, &[]),
        ] {
            assert_eq!(write_of(&s), rack1(None), "{s:?}");
        }
        assert_eq!(write_of(&seen("PUT", "/racks/1", None, &[("x-fence-token", "03")])), rack1(Some(3)));
        for s in [
            seen("GET", "/racks/1", None, &[]),
            seen("POST", "/racks/1", None, &[("x-http-method", "HEAD")]),
            seen("PUT", "/racks/x1", None, &[]),
            seen("PUT", "/racks/1/slots", None, &[]),
        ] {
            assert_eq!(write_of(&s), None, "{s:?}");
        }
    }
}
