//! How a proxy names a connection's client to the server behind it:
//! appended to `X-Forwarded-For` and `Forwarded` (RFC 7239: an IPv6
//! address quoted and bracketed), keeping what proxies before wrote.
//!
//! Worked out once per connection, and `Forwarded` once per Host: a
//! connection's requests most often carry the same Host, and building the
//! two values per request cost ~1,500 instructions and three allocations
//! (callgrind, `bench/JOURNAL.md` §1, round five).

use std::net::IpAddr;
use std::sync::Mutex;

use hyper::header::{HeaderName, HeaderValue, FORWARDED};
use hyper::HeaderMap;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// One connection's client, as a proxy names it.
#[derive(Debug)]
pub(crate) struct ClientNames {
    /// The IP, as written in headers.
    ip: Box<str>,
    /// `X-Forwarded-For` when no proxy before wrote one: the IP alone.
    alone: HeaderValue,
    /// `Forwarded` when no proxy before wrote one, for the last request's
    /// Host and scheme.
    last: Mutex<Option<Named>>,
}

#[derive(Debug)]
struct Named {
    host: Option<HeaderValue>,
    tls: bool,
    forwarded: HeaderValue,
}

impl ClientNames {
    pub(crate) fn new(ip: IpAddr) -> Self {
        let ip: Box<str> = ip.to_string().into();
        let alone = HeaderValue::from_str(&ip).expect("an IP address is a valid header value");
        ClientNames { ip, alone, last: Mutex::default() }
    }

    /// Append the client to `headers`' `X-Forwarded-For` and `Forwarded`,
    /// with `host` (the Host it asked for) and the scheme it came over.
    pub(crate) fn name(&self, headers: &mut HeaderMap, host: Option<&HeaderValue>, tls: bool) {
        let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
            Some(prev) => HeaderValue::try_from([prev, ", ", &self.ip].concat()).ok(),
            None => Some(self.alone.clone()),
        };
        let fwd = match headers.get(FORWARDED).and_then(|v| v.to_str().ok()) {
            Some(prev) => forwarded(Some(prev), &self.ip, host, tls),
            None => self.forwarded_alone(host, tls),
        };
        if let Some(v) = xff {
            headers.insert(X_FORWARDED_FOR.clone(), v);
        }
        if let Some(v) = fwd {
            headers.insert(FORWARDED, v);
        }
    }

    /// `Forwarded` with this client alone, from the last request's if it
    /// had the same Host and scheme.
    fn forwarded_alone(&self, host: Option<&HeaderValue>, tls: bool) -> Option<HeaderValue> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(named) = last.as_ref().filter(|n| n.host.as_ref() == host && n.tls == tls) {
            return Some(named.forwarded.clone());
        }
        let value = forwarded(None, &self.ip, host, tls)?;
        *last = Some(Named { host: host.cloned(), tls, forwarded: value.clone() });
        Some(value)
    }
}

/// `prev`, if any, then this client's element of `Forwarded`.
fn forwarded(prev: Option<&str>, ip: &str, host: Option<&HeaderValue>, tls: bool) -> Option<HeaderValue> {
    let (open, close) = if ip.contains(':') { ("\"[", "]\"") } else { ("", "") };
    let proto = if tls { "https" } else { "http" };
    let mut fwd = String::with_capacity(64);
    if let Some(prev) = prev {
        fwd.extend([prev, ", "]);
    }
    fwd.extend(["for=", open, ip, close, ";proto=", proto]);
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        // A quoted-string (RFC 7239 §4): a `"` of the client's must not
        // end it and let the client write the rest of our element.
        fwd.push_str(";host=\"");
        for c in h.chars() {
            if c == '"' || c == '\\' {
                fwd.push('\\');
            }
            fwd.push(c);
        }
        fwd.push('"');
    }
    HeaderValue::try_from(fwd).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str) -> ClientNames {
        ClientNames::new(ip.parse().unwrap())
    }

    #[test]
    fn the_client_is_named_after_the_proxies_before_us() {
        let mut h = HeaderMap::new();
        let host = HeaderValue::from_static("inventory.example");
        client("127.0.0.1").name(&mut h, Some(&host), false);
        assert_eq!(h[&X_FORWARDED_FOR], "127.0.0.1");
        assert_eq!(h[FORWARDED], "for=127.0.0.1;proto=http;host=\"inventory.example\"");

        let mut h = HeaderMap::new();
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.7"));
        h.insert(FORWARDED, HeaderValue::from_static("for=203.0.113.7"));
        client("::1").name(&mut h, None, true);
        assert_eq!(h[&X_FORWARDED_FOR], "203.0.113.7, ::1");
        assert_eq!(h[FORWARDED], "for=203.0.113.7, for=\"[::1]\";proto=https");

        // A client's `"` in Host cannot close our quoted host and forge `for=`.
        let mut h = HeaderMap::new();
        let host = HeaderValue::from_static("x\", for=6.6.6.6, a=\"\\");
        client("127.0.0.1").name(&mut h, Some(&host), false);
        assert_eq!(h[FORWARDED], r#"for=127.0.0.1;proto=http;host="x\", for=6.6.6.6, a=\"\\""#);
    }

    /// What one request of a connection was named with is not the next
    /// one's when its Host, its scheme, or the proxies before it differ.
    #[test]
    fn a_connections_requests_are_each_named_for_their_own_host() {
        let c = client("10.0.0.9");
        let name = |host: Option<&'static str>, tls: bool, prev: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(p) = prev {
                h.insert(FORWARDED, HeaderValue::from_static(p));
            }
            c.name(&mut h, host.map(HeaderValue::from_static).as_ref(), tls);
            h[FORWARDED].to_str().unwrap().to_string()
        };
        assert_eq!(name(Some("a"), false, None), "for=10.0.0.9;proto=http;host=\"a\"");
        assert_eq!(name(Some("a"), false, None), "for=10.0.0.9;proto=http;host=\"a\"");
        assert_eq!(name(Some("b"), false, None), "for=10.0.0.9;proto=http;host=\"b\"");
        assert_eq!(name(None, false, None), "for=10.0.0.9;proto=http");
        assert_eq!(name(None, true, None), "for=10.0.0.9;proto=https");
        assert_eq!(name(Some("b"), true, Some("for=1.2.3.4")), "for=1.2.3.4, for=10.0.0.9;proto=https;host=\"b\"");
        assert_eq!(name(Some("b"), true, None), "for=10.0.0.9;proto=https;host=\"b\"");
    }
}
