//! What the route phase reads of a request's head before any route is
//! chosen: framing that two HTTP implementations could read differently
//! (S6), a method in lower case, and the headers and the parameter by which
//! an upstream's framework would take the request for another path or
//! method than the one routed. Pure: no IO.
//!
//! One pass over the headers, not a lookup per name: a request carries a
//! few headers, and the dozen lookups (each hashing its name) cost more
//! than the pass (`bench/instructions.rs`).

use fencegate_client::wire::Problem;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{HeaderMap, Method};

use crate::sidecar::answer::Answer;

/// Headers by which frameworks and proxies take a request for another path
/// (or, set by a proxy in front, another method) than the one routed (IIS
/// URL rewrite, Symfony, nginx setups): refused on every route.
static REWRITES: [HeaderName; 4] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-original-method"),
    HeaderName::from_static("x-override-url"),
];

/// Headers by which method-override middleware (Express, Rails, Spring,
/// ASP.NET) takes a request for another method; and the `_method` query
/// parameter. Taken only on routes that allow them (`find_overridden`).
static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The head checked: `Ok(Some(m))` if the request asks the upstream to take
/// it as method `m` (by header or `_method`, upper-cased as middleware
/// does; whether a route allows it is the route's to say). Refused, in this
/// order: a lower-case method, a disguise, ambiguous framing, a body
/// announced above `max_body`, two overrides or one that is not a method.
pub(crate) fn check(
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    max_body: u64,
) -> Result<Option<Method>, Answer> {
    // Methods are case-sensitive in HTTP, but some upstreams upper-case
    // them: `put` must not slip past a route fenced for `PUT`.
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(bad(Problem::MalformedMethod, "methods must be upper case".into()));
    }
    let seen = Seen::scan(headers);
    if let Some(i) = seen.rewrite {
        let name = &REWRITES[i];
        return Err(disguised(format!("{name} would make the upstream take this request as another one")));
    }
    if seen.token_unnamed {
        return Err(disguised(
            "Connection names X-Fence-Token: the upstream would not get the token checked here".into(),
        ));
    }
    let ambiguous = |m: &str| bad(Problem::AmbiguousFraming, m.to_string());
    if seen.lengths > 1 {
        return Err(ambiguous("more than one Content-Length"));
    }
    if seen.lengths == 1 && seen.codings > 0 {
        return Err(ambiguous("both Content-Length and Transfer-Encoding"));
    }
    // hyper decodes `chunked` and drops Content-Length next to it; any
    // other coding would reach the upstream undeclared, since
    // Transfer-Encoding is hop-by-hop.
    if seen.codings > 1 || (seen.codings == 1 && !seen.chunked) {
        return Err(ambiguous("Transfer-Encoding other than a single `chunked`"));
    }
    if let Some(len) = seen.length {
        // Digits only (`+5` parses as a u64): hyper's parser refuses the
        // rest before this, but this check does not lean on it.
        let digits = Some(len.as_bytes()).filter(|b| !b.is_empty() && b.iter().all(u8::is_ascii_digit));
        let len: u64 = digits
            .and_then(|b| std::str::from_utf8(b).ok()?.parse().ok())
            .ok_or_else(|| ambiguous("bad Content-Length"))?;
        if len > max_body {
            return Err(Answer::TooLarge { limit: max_body });
        }
    }
    let mut asked = seen.asked;
    let params = query.into_iter().flat_map(|q| q.split('&')).filter_map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        k.eq_ignore_ascii_case("_method").then_some(v.as_bytes())
    });
    for value in params {
        asked.ask(value);
    }
    match asked {
        Asked::None => Ok(None),
        Asked::Two => Err(disguised("the request asks for two method overrides".into())),
        Asked::One(m) => Method::from_bytes(&m)
            .map(Some)
            .map_err(|_| disguised(format!("method override {:?} is not a method", String::from_utf8_lossy(&m)))),
    }
}

fn bad(error: Problem, message: String) -> Answer {
    Answer::BadRequest { error, message }
}

fn disguised(message: String) -> Answer {
    bad(Problem::DisguisedRequest, message)
}

/// What one pass over the headers found.
#[derive(Default)]
struct Seen<'h> {
    /// Content-Length headers, and the first one's value.
    lengths: usize,
    length: Option<&'h HeaderValue>,
    /// Transfer-Encoding headers, and whether the first is `chunked`.
    codings: usize,
    chunked: bool,
    /// The first of `REWRITES` present, in that list's order.
    rewrite: Option<usize>,
    /// Connection names X-Fence-Token, which a proxy on the way would drop.
    token_unnamed: bool,
    asked: Asked,
}

impl<'h> Seen<'h> {
    fn scan(headers: &'h HeaderMap) -> Seen<'h> {
        let mut seen = Seen::default();
        for (name, value) in headers {
            if name == CONTENT_LENGTH {
                seen.lengths += 1;
                seen.length.get_or_insert(value);
            } else if name == TRANSFER_ENCODING {
                seen.codings += 1;
                if seen.codings == 1 {
                    seen.chunked = value.as_bytes().eq_ignore_ascii_case(b"chunked");
                }
            } else if name == CONNECTION {
                let token = fencegate_client::TOKEN_HEADER.as_bytes();
                seen.token_unnamed |=
                    value.as_bytes().split(|b| *b == b',').any(|n| n.trim_ascii().eq_ignore_ascii_case(token));
            } else if let Some(i) = REWRITES.iter().position(|n| n == name) {
                seen.rewrite = Some(seen.rewrite.map_or(i, |j| j.min(i)));
            } else if METHOD_OVERRIDES.contains(name) {
                seen.asked.ask(value.as_bytes());
            }
        }
        seen
    }
}

/// The method overrides a request asks for, trimmed and upper-cased as
/// middleware reads them.
#[derive(Default)]
enum Asked {
    #[default]
    None,
    One(Vec<u8>),
    /// Two that differ.
    Two,
}

impl Asked {
    fn ask(&mut self, value: &[u8]) {
        let value = value.trim_ascii().to_ascii_uppercase();
        *self = match std::mem::take(self) {
            Asked::None => Asked::One(value),
            Asked::One(first) if first == value => Asked::One(first),
            Asked::One(_) | Asked::Two => Asked::Two,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn problem(pairs: &[(&str, &str)], query: Option<&str>) -> Option<(Problem, String)> {
        match check(&Method::PUT, &headers(pairs), query, 1000) {
            Ok(_) => None,
            Err(Answer::BadRequest { error, message }) => Some((error, message)),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_in_disguise_are_named() {
        for pairs in [
            vec![("X-Original-URL", "/racks/42")],
            vec![("X-Rewrite-URL", "/racks/42")],
            vec![("x-original-method", "PUT")],
            vec![("Connection", "close, X-Fence-Token")],
            vec![("Connection", "keep-alive"), ("Connection", " x-fence-token ")],
        ] {
            assert_eq!(problem(&pairs, None).map(|p| p.0), Some(Problem::DisguisedRequest), "{pairs:?}");
        }
        for pairs in [vec![("Connection", "close"), ("X-Fence-Token", "7")], vec![("X-Forwarded-For", "10.0.0.1")]] {
            assert_eq!(problem(&pairs, None), None, "{pairs:?}");
        }
        // Named in the list's order, whatever the request's.
        let two = problem(&[("X-Override-URL", "/a"), ("X-Original-URL", "/b")], None).unwrap();
        assert!(two.1.starts_with("x-original-url "), "{two:?}");
    }

    #[test]
    fn method_overrides_are_read_as_middleware_reads_them() {
        for (pairs, query, want) in [
            (vec![("X-HTTP-Method-Override", "PUT")], None, Some(Method::PUT)),
            (vec![("x-http-method", "delete")], None, Some(Method::DELETE)),
            (vec![("X-Method-Override", " patch ")], None, Some(Method::PATCH)),
            (vec![], Some("a=1&_METHOD=put"), Some(Method::PUT)),
            (vec![("X-HTTP-Method-Override", "PUT")], Some("_method=PUT"), Some(Method::PUT)),
            (vec![("X-HTTP-Method-Override", "PUT"), ("x-method-override", "put")], None, Some(Method::PUT)),
            (vec![], Some("method=PUT&x_method=1"), None),
            (vec![], None, None),
        ] {
            assert_eq!(check(&Method::POST, &headers(&pairs), query, 0).unwrap(), want, "{pairs:?} {query:?}");
        }
        for (pairs, query) in [
            (vec![("X-HTTP-Method-Override", "PUT"), ("X-HTTP-Method-Override", "DELETE")], None),
            (vec![("X-HTTP-Method-Override", "PUT")], Some("_method=DELETE")),
            (vec![("x-http-method", "PUT"), ("X-Method-Override", "PUT"), ("X-HTTP-Method", "GET")], None),
            (vec![], Some("_method=P(T")),
            (vec![], Some("_method")),
        ] {
            assert_eq!(problem(&pairs, query).map(|p| p.0), Some(Problem::DisguisedRequest), "{pairs:?} {query:?}");
        }
    }

    #[test]
    fn framing_two_parsers_could_read_differently_is_refused() {
        for pairs in [
            vec![("Content-Length", "5"), ("Content-Length", "5")],
            vec![("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
            vec![("Transfer-Encoding", "gzip")],
            vec![("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")],
            vec![("Content-Length", "+5")],
            vec![("Content-Length", "5, 5")],
        ] {
            assert_eq!(problem(&pairs, None).map(|p| p.0), Some(Problem::AmbiguousFraming), "{pairs:?}");
        }
        for pairs in [vec![("Content-Length", "5")], vec![("Transfer-Encoding", "Chunked")], vec![]] {
            assert_eq!(problem(&pairs, None), None, "{pairs:?}");
        }
        let over = check(&Method::PUT, &headers(&[("Content-Length", "1001")]), None, 1000);
        assert!(matches!(over, Err(Answer::TooLarge { limit: 1000 })));
        // A disguise is named before the framing.
        let both = [("Content-Length", "5"), ("Content-Length", "6"), ("X-Rewrite-URL", "/")];
        assert_eq!(problem(&both, None).map(|p| p.0), Some(Problem::DisguisedRequest));
        let lower = check(&Method::from_bytes(b"put").unwrap(), &HeaderMap::new(), None, 0);
        assert!(matches!(lower, Err(Answer::BadRequest { error: Problem::MalformedMethod, .. })));
    }
}
