//! Base URLs: the lock service's endpoints, peers and upstreams, which
//! request paths are appended to. Parsed once, where they are configured.

use hyper::Uri;

/// A URL that paths are appended to: absolute, without a path or query.
pub fn parse_base(url: &str) -> Result<Uri, String> {
    let uri: Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{url:?} must not have a path or query"));
    }
    Ok(uri)
}

/// A lock service node: `http://host:port`, or `https://host:port` when
/// `tls`; nothing after it.
pub fn parse_endpoint(url: &str, tls: bool) -> Result<Uri, String> {
    let uri = parse_base(url)?;
    match (uri.scheme_str(), tls) {
        (Some("http"), false) | (Some("https"), true) => {}
        (_, false) => return Err(format!("{url:?} must start with http:// (https:// needs a CA to trust)")),
        (_, true) => return Err(format!("{url:?} must start with https:// when TLS is configured")),
    }
    if uri.authority().is_none() || uri.port_u16().is_none() {
        return Err(format!("{url:?} must name a host and a port"));
    }
    Ok(uri)
}

/// Whether `uri`'s host is this machine: `localhost`, or a loopback address.
/// A secret sent there in clear text does not cross a network.
pub fn is_loopback(uri: &Uri) -> bool {
    let host = uri.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for (url, local) in [
            ("http://127.0.0.1:1", true),
            ("http://127.9.9.9:1", true),
            ("http://[::1]:1", true),
            ("http://LocalHost:1", true),
            ("http://10.0.0.1:1", false),
            ("http://lock1.example.net:1", false),
            ("http://localhost.example.net:1", false),
        ] {
            assert_eq!(is_loopback(&url.parse().unwrap()), local, "{url}");
        }
    }

    #[test]
    fn endpoints() {
        assert!(parse_endpoint("http://127.0.0.1:7401", false).is_ok());
        assert!(parse_endpoint("http://127.0.0.1:7401/", false).is_ok());
        assert!(parse_endpoint("https://127.0.0.1:7401", true).is_ok());
        assert!(parse_endpoint("http://127.0.0.1:7401", true).is_err(), "no silent downgrade");
        for bad in ["127.0.0.1:7401", "https://127.0.0.1:7401", "http://127.0.0.1", "http://h:1/x", "http://h:1?q", ""]
        {
            assert!(parse_endpoint(bad, false).is_err(), "{bad:?}");
        }
    }
}
