//! The consoles' pages, served from the binary (docs/decisions/0011): the
//! node's under `/ui`, the sidecar's under `/console`. Each is one page and
//! its script; the helper script, the style and the icon are shared, all
//! embedded at compile time (no build step). No asset holds data: each
//! page's script asks for it with the operator's credentials.
//!
//! Every answer under a console's path carries the one policy: no script
//! but the page's own, no framing, nothing from another origin, nothing
//! kept or sniffed.

use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;

use super::{full, Body};

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                      base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A console: its page and its script.
pub(crate) struct Page {
    pub html: &'static str,
    pub script: &'static str,
}

/// The asset at `path` under the console's `base` (`/ui`): the page, its
/// script (`app.js`), the shared `common.js`, `style.css` and `icon.svg`.
pub(crate) fn asset(base: &str, page: &Page, path: &str) -> Option<Response<Body>> {
    const JS: &str = "text/javascript; charset=utf-8";
    let (kind, text) = match path.strip_prefix(base)? {
        "" | "/" => ("text/html; charset=utf-8", page.html),
        "/app.js" => (JS, page.script),
        "/common.js" => (JS, include_str!("page/common.js")),
        "/style.css" => ("text/css; charset=utf-8", include_str!("page/style.css")),
        "/icon.svg" => ("image/svg+xml", include_str!("page/icon.svg")),
        _ => return None,
    };
    let mut resp = Response::new(full(text));
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    Some(secured(resp))
}

/// Every answer of a console: the policy, and nothing kept or sniffed.
pub(crate) fn secured(mut resp: Response<Body>) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(POLICY));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_are_under_the_base_only_and_secured() {
        let page = Page { html: "<p>", script: "1" };
        let resp = asset("/ui", &page, "/ui/app.js").expect("the script");
        assert_eq!(resp.headers()[CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert!(resp.headers()["content-security-policy"].to_str().unwrap().starts_with("default-src 'none'"));
        for page_path in ["/ui", "/ui/"] {
            assert_eq!(asset("/ui", &page, page_path).unwrap().headers()[CONTENT_TYPE], "text/html; charset=utf-8");
        }
        for none in ["/uix", "/ui/../metrics", "/console/app.js", "/ui/app.js/"] {
            assert!(asset("/ui", &page, none).is_none(), "{none}");
        }
    }
}
