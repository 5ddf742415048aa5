//! The sidecar's route table: which route a request takes, and which lock key
//! (if any) fences it. Pure: built once by `config::sidecar` from the file's
//! routes (it knows nothing of YAML), queried per request.
//!
//! Only canonical request paths are matched; `canonical` says why.
//!
//! Templates: literals match ignoring case, typed `{x:int}` and `{x:slug}`
//! parameters are rendered canonically, listed format `suffixes` are
//! stripped before matching; the first match wins and lock keys come from
//! path parameters; each route carries its parsed upstream. An unfenced
//! route cannot be reached by spelling a fenced path differently: a fenced
//! route whose key is invalid, or whose typed parameter has no canonical
//! form, answers 400 instead of falling through, and an unsafe method on a
//! fenced path that only an unfenced route would take is refused.
//! `shadowed()` finds fenced routes that an earlier route starves (a
//! config error). Methods are checked against the registry. The property
//! tests hold the table to a lenient framework's reading; they write their
//! tables in YAML through the config loader, as users do.

use std::borrow::Cow;
use std::time::Duration;

use hyper::{Method, Uri};
use thiserror::Error;

use crate::config::sidecar::{Fence, MissingToken};
use crate::lock::validate;
use crate::percent::{decode, hex_byte};
use crate::sidecar::idempotency::Policy;

/// Routes in config order; the first one that matches a request wins.
#[derive(Debug, Clone)]
pub struct Routes {
    routes: Vec<Route>,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    /// `None`: every method.
    pub methods: Option<Vec<Method>>,
    pub fence: Fence,
    pub missing_token: MissingToken,
    /// Where the route's requests go (its own upstream or the default one).
    pub upstream: Uri,
    pub timeout: Duration,
    /// An unfenced route that may take unsafe methods on fenced paths.
    allow_unfenced_writes: bool,
    /// Method-override headers may ride on this route's requests.
    allow_method_override: bool,
    /// Requests with an `Idempotency-Key` are applied once (fenced routes).
    pub idempotency: Option<Policy>,
    path: PathTemplate,
    /// Format suffixes (`.json`, lower case) the upstream strips from the
    /// last segment: matched, and the key rendered, without them.
    suffixes: Vec<String>,
    /// `Some` exactly when the route is fenced.
    lock_key: Option<KeyTemplate>,
}

/// A request's route, and the lock key fencing it (`None` on unfenced routes).
#[derive(Debug, Clone)]
pub struct Matched<'a> {
    pub route: &'a Route,
    /// The route's place in the table.
    pub index: usize,
    pub key: Option<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MatchError {
    /// The path is not canonical; the message says where (escaped, shortened).
    #[error("malformed request path {0}")]
    MalformedPath(String),
    #[error("route {route:?} maps this path to lock key {key:?}, which is not a valid key")]
    InvalidKey { route: String, key: String },
    /// A typed parameter (`{rack:int}`) whose value has no canonical form.
    #[error("route {route:?}: {message}")]
    BadParam { route: String, message: String },
    /// An unsafe method on a path a fenced route covers for other methods
    /// would reach the upstream through an unfenced route.
    #[error("{method} on this path would pass unfenced through route {through:?}, but route {fenced:?} fences this path; list {method} in {fenced:?}'s methods")]
    UnfencedWrite { method: String, through: String, fenced: String },
    /// A method override on a request that is not one route's under both
    /// methods, or whose route does not allow overrides.
    #[error("{method} overridden as {effective}: {why}")]
    MethodOverride { method: String, effective: String, why: String },
    #[error("no route matches this request")]
    NoRoute,
}

/// One route as configured, before its templates and methods are parsed.
#[derive(Debug, Clone)]
pub struct RouteSpec<'a> {
    pub name: &'a str,
    pub methods: Option<&'a [String]>,
    pub path: &'a str,
    pub lock_key: Option<&'a str>,
    pub fence: Fence,
    pub missing_token: MissingToken,
    pub upstream: Uri,
    pub timeout: Duration,
    pub allow_unfenced_writes: bool,
    pub allow_method_override: bool,
    pub idempotency: Option<Policy>,
    /// Format suffixes without their dot (`json`).
    pub suffixes: &'a [String],
}

/// Why a route cannot be built: which of its fields, and what is wrong.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid `{field}`: {message}")]
pub struct RouteError {
    /// `path`, `methods` or `lock_key`.
    pub field: &'static str,
    pub message: String,
}

impl Routes {
    /// The table, in order: the first route that matches a request wins.
    pub fn new(routes: Vec<Route>) -> Routes {
        Routes { routes }
    }

    /// The first route matching `method` and `path` (the URI's path as
    /// received, still percent-encoded, without the query), with its lock key.
    pub fn find(&self, method: &Method, path: &str) -> Result<Matched<'_>, MatchError> {
        let body = canonical(path)?;
        for (index, route) in self.routes.iter().enumerate() {
            if route.methods.as_ref().is_some_and(|m| !m.contains(method)) {
                continue;
            }
            let Some(values) = route.matches(body) else { continue };
            let values = values.map_err(|message| MatchError::BadParam { route: route.name.clone(), message })?;
            let Some(template) = &route.lock_key else {
                // A write the fenced route would have taken with another
                // method must not slip through an unfenced one.
                if !is_safe(method) && !route.allow_unfenced_writes {
                    let fenced = self.routes.iter().find(|r| r.lock_key.is_some() && r.fits(body));
                    if let Some(fenced) = fenced {
                        return Err(MatchError::UnfencedWrite {
                            method: method.to_string(),
                            through: route.name.clone(),
                            fenced: fenced.name.clone(),
                        });
                    }
                }
                return Ok(Matched { route, index, key: None });
            };
            let key = template.render(&values);
            // The request is this route's, whatever its key looks like: trying
            // the next route instead could forward a fenced write through an
            // unfenced catch-all. So an unusable key is an error, not a miss.
            if validate::key(&key).is_err() {
                let key = key.chars().take(validate::MAX_KEY_LEN).collect();
                return Err(MatchError::InvalidKey { route: route.name.clone(), key });
            }
            return Ok(Matched { route, index, key: Some(key) });
        }
        Err(MatchError::NoRoute)
    }

    /// The route of a request whose method an override header changes
    /// (`POST` with `X-HTTP-Method-Override: PATCH`): an upstream may apply
    /// it as either method, so both must take one route, and that route
    /// must allow overrides (`allow_method_override`). Fenced, it is fenced
    /// whichever method the upstream believes.
    pub fn find_overridden(&self, method: &Method, effective: &Method, path: &str) -> Result<Matched<'_>, MatchError> {
        let as_sent = self.find(method, path)?;
        let refused = |why: String| MatchError::MethodOverride {
            method: method.to_string(),
            effective: effective.to_string(),
            why,
        };
        match self.find(effective, path) {
            Ok(m) if !std::ptr::eq(m.route, as_sent.route) => Err(refused(format!(
                "the two methods take different routes ({:?} and {:?})",
                as_sent.route.name, m.route.name
            ))),
            Ok(_) if !as_sent.route.allow_method_override => {
                Err(refused(format!("route {:?} does not allow method overrides", as_sent.route.name)))
            }
            Ok(_) => Ok(as_sent),
            Err(e) => Err(refused(format!("as {effective} it would be refused: {e}"))),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }

    /// A fenced route that some of its own requests never reach, because an
    /// earlier route takes them: (its index, the earlier route's index, a
    /// request that shows it). A config with one is a mistake: with an
    /// unfenced route first, its writes would be refused (or, for safe
    /// methods, go unfenced).
    pub fn shadowed(&self) -> Option<(usize, usize, String)> {
        let every = [Method::PUT, Method::POST, Method::PATCH, Method::DELETE, Method::GET];
        for (i, route) in self.routes.iter().enumerate().filter(|(_, r)| r.lock_key.is_some()) {
            let sample = route.path.sample();
            for method in route.methods.as_deref().unwrap_or(&every) {
                let taker = match self.find(method, &sample) {
                    Ok(m) => m.route.name.clone(),
                    Err(MatchError::UnfencedWrite { through, .. }) => through,
                    Err(_) => continue,
                };
                if taker != route.name {
                    let earlier = self.routes.iter().position(|r| r.name == taker).expect("a route of the table");
                    return Some((i, earlier, format!("{method} {sample}")));
                }
            }
        }
        None
    }
}

/// Methods that do not change state (RFC 9110 §9.2.1).
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

impl Route {
    /// Parse the route's path and lock key templates and its methods.
    pub fn build(r: RouteSpec<'_>) -> Result<Route, RouteError> {
        let error = |field, message| RouteError { field, message };
        let path = PathTemplate::parse(r.path).map_err(|m| error("path", format!("{:?} {m}", r.path)))?;
        let methods = parse_methods(r.methods).map_err(|m| error("methods", m))?;
        let lock_key = match (r.lock_key, r.fence.is_fenced()) {
            (Some(k), true) => Some(KeyTemplate::parse(k, &path).map_err(|m| error("lock_key", format!("{k:?} {m}")))?),
            (None, false) => None,
            (None, true) => {
                return Err(error(
                    "lock_key",
                    "is required on a fenced route (fencing is on unless the route says `fence: off`)".into(),
                ))
            }
            (Some(_), false) => return Err(error("lock_key", "must not be set on a route with `fence: off`".into())),
        };
        if r.allow_unfenced_writes && r.fence.is_fenced() {
            return Err(error("allow_unfenced_writes", "is for routes with `fence: off`".into()));
        }
        let suffixes = parse_suffixes(r.suffixes).map_err(|m| error("suffixes", m))?;
        if r.idempotency.is_some() && !r.fence.is_fenced() {
            return Err(error("idempotency", "is for fenced routes (a key is scoped by the lock key)".into()));
        }
        Ok(Route {
            name: r.name.to_string(),
            methods,
            fence: r.fence,
            missing_token: r.missing_token,
            upstream: r.upstream,
            timeout: r.timeout,
            allow_unfenced_writes: r.allow_unfenced_writes,
            allow_method_override: r.allow_method_override,
            idempotency: r.idempotency,
            path,
            lock_key,
            suffixes,
        })
    }

    /// The parameters' values if the canonical path `body` is this route's,
    /// each in its canonical spelling; `Err` if it is, but a typed value has
    /// no canonical form.
    fn matches<'p>(&self, body: &'p str) -> Option<Result<Vec<Cow<'p, str>>, String>> {
        let body = self.without_suffix(body);
        // Nothing is allocated for the routes a request tries and misses.
        self.path.fits(body).then(|| self.path.values(body))
    }

    /// Whether the canonical path `body` is this route's, its typed values
    /// aside: `matches(body).is_some()`.
    fn fits(&self, body: &str) -> bool {
        self.path.fits(self.without_suffix(body))
    }

    /// `body` without a listed format suffix, if it has one: the route is
    /// then matched without it (and not with it).
    fn without_suffix<'p>(&self, body: &'p str) -> &'p str {
        let bare = self.suffixes.iter().find_map(|suffix| {
            let cut = body.len().checked_sub(suffix.len())?;
            let (bare, tail) = (body.get(..cut)?, &body[cut..]);
            // Not a whole segment (`/racks/.json`), nor across a `/`.
            let keeps_a_name = !bare.is_empty() && !bare.ends_with('/');
            (keeps_a_name && tail.eq_ignore_ascii_case(suffix)).then_some(bare)
        });
        bare.unwrap_or(body)
    }

    /// The path template as configured, e.g. `/racks/{rack}`.
    pub fn path(&self) -> &str {
        &self.path.source
    }

    /// The lock key template as configured, e.g. `rack/{rack}`.
    pub fn lock_key(&self) -> Option<&str> {
        self.lock_key.as_ref().map(|k| k.source.as_str())
    }
}

/// The methods of the IANA registry (RFC 9110, WebDAV and its extensions,
/// PATCH), the common unregistered PURGE and QUERY, and UPnP's M-SEARCH,
/// NOTIFY, SUBSCRIBE and UNSUBSCRIBE: a route listing anything else (`PUTT`)
/// is surely mistyped, and would leave the write it meant to fence to the
/// routes after it.
const KNOWN_METHODS: &[&str] = &[
    "M-SEARCH",
    "NOTIFY",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "ACL",
    "BASELINE-CONTROL",
    "BIND",
    "CHECKIN",
    "CHECKOUT",
    "CONNECT",
    "COPY",
    "DELETE",
    "GET",
    "HEAD",
    "LABEL",
    "LINK",
    "LOCK",
    "MERGE",
    "MKACTIVITY",
    "MKCALENDAR",
    "MKCOL",
    "MKREDIRECTREF",
    "MKWORKSPACE",
    "MOVE",
    "OPTIONS",
    "ORDERPATCH",
    "PATCH",
    "POST",
    "PRI",
    "PROPFIND",
    "PROPPATCH",
    "PURGE",
    "PUT",
    "QUERY",
    "REBIND",
    "REPORT",
    "SEARCH",
    "TRACE",
    "UNBIND",
    "UNCHECKOUT",
    "UNLINK",
    "UNLOCK",
    "UPDATE",
    "UPDATEREDIRECTREF",
    "VERSION-CONTROL",
];

/// Methods are case-sensitive (RFC 9110): `put` would be a different, custom
/// method, and in a config it is surely a typo that leaves PUT unfenced.
fn parse_methods(names: Option<&[String]>) -> Result<Option<Vec<Method>>, String> {
    let Some(names) = names else { return Ok(None) };
    if names.is_empty() {
        return Err("must not be empty (leave it out to match every method)".into());
    }
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let known = |n: &str| KNOWN_METHODS.contains(&n) || n.starts_with("X-");
    let mut methods: Vec<Method> = Vec::with_capacity(names.len());
    for name in names {
        let method = Some(name)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| is_tchar(b) && !b.is_ascii_lowercase()))
            .and_then(|n| Method::from_bytes(n.as_bytes()).ok())
            .ok_or_else(|| format!("{name:?} is not an upper-case HTTP method"))?;
        if !known(name) {
            return Err(format!(
                "{name} is not a registered HTTP method (a typo?); a method of your own must start with X-"
            ));
        }
        if methods.contains(&method) {
            return Err(format!("{name} is listed twice"));
        }
        methods.push(method);
    }
    Ok(Some(methods))
}

/// `/`-separated segments: literals, `{name}` (one segment) and a final
/// `{*name}` (the rest of the path, zero or more segments).
#[derive(Debug, Clone)]
struct PathTemplate {
    source: String,
    segments: Vec<Segment>,
    /// The parameters' names in order; a match yields one value for each.
    params: Vec<String>,
}

#[derive(Debug, Clone)]
enum Segment {
    /// Percent-decoded, and compared with the request's decoded segment.
    Literal(Vec<u8>),
    Param(ParamType),
    Rest,
}

/// What a parameter's value must be, and its one canonical spelling (so that
/// one resource always renders one lock key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParamType {
    /// Taken as it is.
    Any,
    /// `{rack:int}`: decimal digits only, rendered without leading zeros
    /// (`042` is `42`); anything else (`42.json`, `42.0`, `-1`) is refused.
    Int,
    /// `{name:slug}`: ASCII letters, digits, `-` and `_`, rendered in lower
    /// case (`Web-01` is `web-01`, as case-insensitive lookups read it);
    /// anything else (`web.01`, `web%20`) is refused.
    Slug,
}

impl ParamType {
    const NAMES: &'static str = "int, slug";

    fn named(name: &str) -> Option<ParamType> {
        match name {
            "int" => Some(ParamType::Int),
            "slug" => Some(ParamType::Slug),
            _ => None,
        }
    }

    /// `value` in its one canonical spelling, or why it has none.
    fn canonical(self, value: &str) -> Result<Cow<'_, str>, String> {
        match self {
            ParamType::Any => Ok(Cow::Borrowed(value)),
            ParamType::Int => {
                if value.is_empty() || value.len() > 20 || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("{value:?} is not an integer"));
                }
                let trimmed = value.trim_start_matches('0');
                Ok(Cow::Borrowed(if trimmed.is_empty() { "0" } else { trimmed }))
            }
            ParamType::Slug => {
                let ok = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
                if value.is_empty() || value.len() > MAX_SLUG_LEN || !value.bytes().all(ok) {
                    return Err(format!("{value:?} is not a slug (letters, digits, - and _)"));
                }
                Ok(if value.bytes().any(|b| b.is_ascii_uppercase()) {
                    Cow::Owned(value.to_ascii_lowercase())
                } else {
                    Cow::Borrowed(value)
                })
            }
        }
    }
}

const MAX_SLUG_LEN: usize = 128;

/// At most this many format suffixes on a route, each at most `MAX_SUFFIX_LEN`.
const MAX_SUFFIXES: usize = 16;
const MAX_SUFFIX_LEN: usize = 16;

/// `.json`-style suffixes, lower case, from the config's `[json, XML]`.
fn parse_suffixes(suffixes: &[String]) -> Result<Vec<String>, String> {
    if suffixes.len() > MAX_SUFFIXES {
        return Err(format!("at most {MAX_SUFFIXES}"));
    }
    let mut out: Vec<String> = Vec::with_capacity(suffixes.len());
    for s in suffixes {
        let name = s.strip_prefix('.').unwrap_or(s);
        if name.is_empty() || name.len() > MAX_SUFFIX_LEN || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(format!("{s:?}: a suffix is 1 to {MAX_SUFFIX_LEN} letters and digits, like json"));
        }
        let suffix = format!(".{}", name.to_ascii_lowercase());
        if out.contains(&suffix) {
            return Err(format!("lists {suffix} twice"));
        }
        out.push(suffix);
    }
    Ok(out)
}

impl PathTemplate {
    fn parse(source: &str) -> Result<Self, String> {
        let Some(body) = source.strip_prefix('/') else { return Err("must start with /".into()) };
        let mut template = PathTemplate { source: source.to_string(), segments: Vec::new(), params: Vec::new() };
        if body.is_empty() {
            return Ok(template);
        }
        let parts: Vec<&str> = body.split('/').collect();
        for (i, &part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let (name, segment) = match inner.strip_prefix('*') {
                    Some(name) if last => (name, Segment::Rest),
                    Some(_) => {
                        return Err(format!("{part} takes the rest of the path, so it must be the last segment"))
                    }
                    None => match inner.split_once(':') {
                        None => (inner, Segment::Param(ParamType::Any)),
                        Some((name, kind)) => match ParamType::named(kind) {
                            Some(t) => (name, Segment::Param(t)),
                            None => {
                                let known = ParamType::NAMES;
                                return Err(format!("{part}: unknown parameter type {kind:?} (known: {known})"));
                            }
                        },
                    },
                };
                if !is_param_name(name) {
                    return Err(format!("{part}: a parameter name is [A-Za-z_][A-Za-z0-9_]*"));
                }
                if template.params.iter().any(|p| p == name) {
                    return Err(format!("names the parameter {{{name}}} twice"));
                }
                template.params.push(name.to_string());
                template.segments.push(segment);
            } else if part.contains(['{', '}']) {
                return Err(format!("segment {part:?}: a parameter must be a whole segment, like /{{name}}"));
            } else if part.is_empty() {
                return Err(if last {
                    "must not end with / (a request's trailing slash is ignored anyway)".into()
                } else {
                    "must not have an empty segment (//)".into()
                });
            } else {
                // A literal no canonical request could spell would never match.
                check_segment(part).map_err(|why| format!("segment {part:?} {why}"))?;
                template.segments.push(Segment::Literal(decode(part)));
            }
        }
        Ok(template)
    }

    /// Whether the canonical path `body` has this template's literals and
    /// number of segments (its typed values aside).
    fn fits(&self, body: &str) -> bool {
        let mut next = Segments::new(body);
        for segment in &self.segments {
            match (segment, next.next()) {
                (Segment::Rest, _) => return true,
                (_, None) => return false,
                (Segment::Literal(literal), Some((_, s))) if !literal_eq(s, literal) => return false,
                _ => {}
            }
        }
        next.next().is_none()
    }

    /// The parameters' values of a path that `fits`, each in its canonical
    /// spelling; `Err` for the first typed one that has none.
    fn values<'p>(&self, body: &'p str) -> Result<Vec<Cow<'p, str>>, String> {
        let mut values = Vec::with_capacity(self.params.len());
        let mut next = Segments::new(body);
        for segment in &self.segments {
            match (segment, next.next()) {
                (Segment::Literal(_), _) => {}
                (Segment::Param(t), s) => values.push(t.canonical(s.map_or("", |(_, s)| s))?),
                // Slicing `body` keeps the separators: the remainder is
                // exactly what follows, trailing slash aside.
                (Segment::Rest, s) => values.push(Cow::Borrowed(s.map_or("", |(at, _)| &body[at..]))),
            }
        }
        Ok(values)
    }

    /// A request path this template matches (`x` for a parameter, `1` for
    /// an `int` one).
    fn sample(&self) -> String {
        let parts = self.source.split('/').skip(1).map(|part| match part.strip_prefix('{') {
            Some(p) if p.ends_with(":int}") => "1",
            Some(p) if p.ends_with(":slug}") => "x",
            Some(_) => "x",
            None => part,
        });
        format!("/{}", parts.collect::<Vec<_>>().join("/"))
    }
}

fn is_param_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A lock key with `{param}` placeholders naming the path's parameters
/// (`{rest}` for a path's `{*rest}`).
#[derive(Debug, Clone)]
struct KeyTemplate {
    source: String,
    parts: Vec<KeyPart>,
}

#[derive(Debug, Clone)]
enum KeyPart {
    Literal(String),
    /// Index into the path template's parameters.
    Param(usize),
}

impl KeyTemplate {
    fn parse(source: &str, path: &PathTemplate) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err("has a '}' without a '{'".into());
            }
            if open > 0 {
                parts.push(KeyPart::Literal(rest[..open].to_string()));
            }
            let Some(len) = rest[open + 1..].find('}') else { return Err("has a '{' without a '}'".into()) };
            let name = &rest[open + 1..open + 1 + len];
            if let Some(bare) = name.strip_prefix('*') {
                return Err(format!("must write {{{bare}}}, not {{{name}}}: only the path marks the rest with *"));
            }
            let Some(index) = path.params.iter().position(|p| p == name) else {
                return Err(format!("uses {{{name}}}, which is not a parameter of the path {:?}", path.source));
            };
            parts.push(KeyPart::Param(index));
            rest = &rest[open + 1 + len + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Literal(rest.to_string()));
        }
        let template = KeyTemplate { source: source.to_string(), parts };
        // Catch literal mistakes (`rack//{rack}`, `rack {rack}`) now rather than
        // as an InvalidKey on every request.
        let sample = template.render(&vec![Cow::Borrowed("x"); path.params.len()]);
        validate::key(&sample).map_err(|e| format!("can never be a valid lock key: {e}"))?;
        Ok(template)
    }

    fn render(&self, values: &[Cow<'_, str>]) -> String {
        let parts = self.parts.iter().map(|part| match part {
            KeyPart::Literal(s) => s.as_str(),
            KeyPart::Param(i) => &values[*i],
        });
        // Sized once: collecting would grow it part by part.
        let mut key = String::with_capacity(parts.clone().map(str::len).sum());
        parts.for_each(|p| key.push_str(p));
        key
    }
}

/// Check that `path` is canonical and return it without its leading `/` and
/// its one optional trailing `/`.
///
/// Why so strict: fenced and unfenced routes overlap (`/racks/{rack}` fenced,
/// `/{*rest}` not). If `/racks/./42`, `//racks/42` or `/racks/%34%32` were let
/// through, they would miss the fenced route, match the catch-all, and most
/// upstreams would normalise or decode them back into `/racks/42`: a write to a
/// fenced resource without a token check. Rather than normalise ourselves and
/// hope to agree with every upstream's normaliser, we refuse every spelling that
/// some upstream rewrites into another path (see `check_segment`). What is
/// left decodes the same way everywhere, and literal segments are compared
/// decoded, so `items%3Abatch` cannot dodge a route written `items:batch`.
///
/// Not covered: an upstream that ignores case (`/RACKS/42`) must be given
/// routes that cover every case itself.
pub fn canonical(path: &str) -> Result<&str, MatchError> {
    let malformed = |why: &str| {
        let shown: String = path.chars().take(128).collect();
        MatchError::MalformedPath(format!("{shown:?}: {why}"))
    };
    let Some(body) = path.strip_prefix('/') else { return Err(malformed("must start with /")) };
    // `//` would otherwise become `/` here.
    if body.starts_with('/') {
        return Err(malformed("empty segment"));
    }
    let body = body.strip_suffix('/').unwrap_or(body);
    if body.is_empty() {
        return Ok(body);
    }
    for (_, segment) in Segments::new(body) {
        if segment.is_empty() {
            return Err(malformed("empty segment"));
        }
        check_segment(segment).map_err(|why| malformed(&format!("segment {segment:?} {why}")))?;
    }
    // Overlong UTF-8 such as %C0%AE reads as '.' to lenient decoders.
    if body.as_bytes().contains(&b'%') && std::str::from_utf8(&decode(body)).is_err() {
        return Err(malformed("percent-encodes bytes that are not UTF-8"));
    }
    Ok(body)
}

/// One path segment (request or template literal), or why it is refused.
fn check_segment(segment: &str) -> Result<(), String> {
    if segment == "." || segment == ".." {
        return Err("is a dot segment".into());
    }
    let bytes = segment.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let Some(v) = hex_byte(bytes.get(i + 1..i + 3)) else {
                    return Err("has an invalid percent escape".into());
                };
                let escape = &segment[i..i + 3];
                // Unreserved characters mean the same encoded or not (RFC 3986),
                // so upstreams decode them: %2E%2E is `..`, %34%32 is `42`.
                if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') {
                    return Err(format!("percent-encodes an unreserved character ({escape})"));
                }
                // Some upstreams decode before splitting (%2F is `/`, %5C is `\`),
                // or decode twice (%25 is `%`), or stop at NUL.
                if matches!(v, b'/' | b'\\' | b'%') || v.is_ascii_control() {
                    return Err(format!("percent-encodes a separator, '%' or a control character ({escape})"));
                }
                i += 3;
            }
            // Windows servers read `\` as `/`.
            b'\\' => return Err("contains a backslash".into()),
            // Servlet containers drop `;params` from segments: /racks;x/42 is /racks/42.
            b';' => return Err("contains ';' (path parameters are not supported)".into()),
            b if b <= b' ' || b >= 0x7f => return Err("contains a space, a control or a non-ASCII character".into()),
            _ => i += 1,
        }
    }
    Ok(())
}

/// The segments of a canonical path without its leading and trailing `/`
/// (none if it is empty), with their offsets so that `{*rest}` can slice the
/// remainder. Cut as they are read: a route that differs in its first
/// segment reads no further.
struct Segments<'p> {
    body: &'p str,
    /// Where the next segment starts; past the end when there is none.
    at: usize,
}

impl<'p> Segments<'p> {
    fn new(body: &'p str) -> Segments<'p> {
        Segments { body, at: if body.is_empty() { 1 } else { 0 } }
    }
}

impl<'p> Iterator for Segments<'p> {
    type Item = (usize, &'p str);

    fn next(&mut self) -> Option<(usize, &'p str)> {
        let rest = self.body.get(self.at..)?;
        // A byte search: `str::find` sets up a searcher, costly on short segments.
        let len = rest.bytes().position(|b| b == b'/').unwrap_or(rest.len());
        let segment = (self.at, &rest[..len]);
        self.at += len + 1;
        Some(segment)
    }
}

/// Literals compare ignoring ASCII case: many frameworks (Express, ASP.NET,
/// Spring by default on some versions) route `/RACKS/42` as `/racks/42`, and
/// a fenced route must catch every spelling its upstream would serve.
fn literal_eq(segment: &str, literal: &[u8]) -> bool {
    if segment.as_bytes().contains(&b'%') {
        decode(segment).eq_ignore_ascii_case(literal)
    } else {
        segment.as_bytes().eq_ignore_ascii_case(literal)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::sidecar::{Consistency, FenceMode};
    // Tables are written as users write them, in the config's YAML.
    use crate::config::sidecar::RouteConfig;
    use crate::sidecar::settings::compile_routes;

    const DEFAULT_UPSTREAM: &str = "http://127.0.0.1:9000";

    fn compile(yaml: &str) -> Result<Routes, crate::config::ConfigError> {
        let routes = serde_yaml_ng::from_str::<Vec<RouteConfig>>(yaml).unwrap();
        compile_routes(
            &routes,
            &DEFAULT_UPSTREAM.parse().unwrap(),
            crate::config::sidecar::Limits::default().idempotency_store,
        )
    }

    /// A table written in the config's YAML.
    pub(in crate::sidecar) fn routes(yaml: &str) -> Routes {
        compile(yaml).unwrap()
    }

    fn build_err(yaml: &str) -> String {
        compile(yaml).unwrap_err().to_string()
    }

    const TABLE: &str = "
- name: rack-writes
  methods: [PUT, POST, PATCH, DELETE]
  path: /racks/{rack}
  lock_key: rack/{rack}
  fence: { mode: strict, consistency: linearizable }
- name: slots
  path: /racks/{rack}/slots/{slot}
  lock_key: rack/{rack}/slot/{slot}
  missing_token: allow
  upstream: http://127.0.0.1:9001
  timeout: 5s
- name: files
  methods: [PUT]
  path: /files/{*file}
  lock_key: files/{file}
  fence: { mode: observed }
- name: batch
  methods: [POST]
  path: /v1/items:batch
  lock_key: items
- name: root
  path: /
  fence: off
- name: reads
  methods: [GET, HEAD]
  path: /{*rest}
  fence: off
";

    /// The route name and key a request gets.
    fn find(routes: &Routes, method: &str, path: &str) -> Result<(String, Option<String>), MatchError> {
        let m = routes.find(&Method::from_bytes(method.as_bytes()).unwrap(), path)?;
        Ok((m.route.name.clone(), m.key))
    }

    fn found(name: &str, key: Option<&str>) -> Result<(String, Option<String>), MatchError> {
        Ok((name.to_string(), key.map(String::from)))
    }

    #[test]
    fn builds_routes_from_the_config() {
        let t = routes(TABLE);
        let all: Vec<&Route> = t.iter().collect();
        assert_eq!(all.len(), 6);
        assert_eq!(all[0].name, "rack-writes");
        assert_eq!(all[0].methods, Some(vec![Method::PUT, Method::POST, Method::PATCH, Method::DELETE]));
        assert_eq!(all[0].fence, Fence::On { mode: FenceMode::Strict, consistency: Consistency::Linearizable });
        assert_eq!((all[0].path(), all[0].lock_key()), ("/racks/{rack}", Some("rack/{rack}")));
        assert_eq!(all[1].methods, None);
        assert_eq!(all[1].missing_token, MissingToken::Allow);
        assert_eq!(all[1].upstream, "http://127.0.0.1:9001");
        assert_eq!(all[0].upstream, DEFAULT_UPSTREAM, "routes without their own upstream get the default");
        assert_eq!(all[1].timeout, Duration::from_secs(5));
        assert_eq!((all[5].path(), all[5].lock_key()), ("/{*rest}", None));
        assert_eq!(all[5].fence, Fence::Off);
    }

    #[test]
    fn first_match_wins_and_methods_filter() {
        let t = routes(TABLE);
        assert_eq!(find(&t, "PUT", "/racks/42"), found("rack-writes", Some("rack/42")));
        assert_eq!(find(&t, "DELETE", "/racks/42"), found("rack-writes", Some("rack/42")));
        // GET is not one of rack-writes' methods; it falls to the catch-all.
        assert_eq!(find(&t, "GET", "/racks/42"), found("reads", None));
        // Methods are exact: no HEAD for GET, no custom lower-case "put" for PUT.
        assert_eq!(find(&t, "HEAD", "/racks/42"), found("reads", None));
        assert_eq!(find(&t, "put", "/racks/42"), Err(MatchError::NoRoute));
        // `slots` has no methods: all of them.
        for method in ["GET", "PUT", "PURGE"] {
            assert_eq!(find(&t, method, "/racks/7/slots/3"), found("slots", Some("rack/7/slot/3")), "{method}");
        }
        // An earlier route shadows a later one that would also match.
        let t = routes("[{ name: a, path: '/x/{id}', fence: off }, { name: b, path: /x/y, fence: off }]");
        assert_eq!(find(&t, "GET", "/x/y"), found("a", None));
    }

    #[test]
    fn params_catch_all_and_trailing_slash() {
        let t = routes(TABLE);
        assert_eq!(find(&t, "PUT", "/racks/rack-42"), found("rack-writes", Some("rack/rack-42")));
        assert_eq!(find(&t, "PUT", "/racks/42/"), found("rack-writes", Some("rack/42")));
        assert_eq!(find(&t, "PUT", "/racks/a.b_c:d~"), Err(invalid_key("rack-writes", "rack/a.b_c:d~")));
        assert_eq!(find(&t, "PUT", "/racks/42/slots/7/"), found("slots", Some("rack/42/slot/7")));
        // A parameter is exactly one segment.
        assert_eq!(find(&t, "PUT", "/racks/42/x"), Err(MatchError::NoRoute));
        assert_eq!(find(&t, "PUT", "/racks"), Err(MatchError::NoRoute));
        assert_eq!(find(&t, "GET", "/racks"), found("reads", None));
        // The catch-all takes the remainder with its slashes, but not a trailing one.
        assert_eq!(find(&t, "PUT", "/files/a"), found("files", Some("files/a")));
        assert_eq!(find(&t, "PUT", "/files/a/b.txt"), found("files", Some("files/a/b.txt")));
        assert_eq!(find(&t, "PUT", "/files/a/b/"), found("files", Some("files/a/b")));
        // ... and it may be empty, which here makes an invalid key (`files/`).
        assert_eq!(find(&t, "PUT", "/files"), Err(invalid_key("files", "files/")));
        assert_eq!(find(&t, "PUT", "/files/"), Err(invalid_key("files", "files/")));
        // `/` is its own route; the catch-all also matches it with an empty rest.
        assert_eq!(find(&t, "DELETE", "/"), found("root", None));
        let t = routes("[{ name: all, path: '/{*rest}', lock_key: 'all/{rest}', fence: { mode: observed } }]");
        assert_eq!(find(&t, "PUT", "/"), Err(invalid_key("all", "all/")));
        assert_eq!(find(&t, "PUT", "/a/b"), found("all", Some("all/a/b")));
    }

    #[test]
    fn lock_keys_are_substituted() {
        let t = routes(
            "
- name: mixed
  path: /dc/{dc}/racks/{rack}/{*rest}
  lock_key: '{rack}-in-{dc}:{rest}/x'
",
        );
        assert_eq!(find(&t, "PUT", "/dc/ams1/racks/42/a/b"), found("mixed", Some("42-in-ams1:a/b/x")));
        // A parameter that is not in the key does not matter to the key.
        let t = routes("[{ name: r, path: '/racks/{rack}/items/{item}', lock_key: 'rack/{rack}' }]");
        assert_eq!(find(&t, "PUT", "/racks/1/items/9"), found("r", Some("rack/1")));
    }

    fn invalid_key(route: &str, key: &str) -> MatchError {
        MatchError::InvalidKey { route: route.into(), key: key.into() }
    }

    #[test]
    fn an_invalid_key_does_not_fall_through() {
        let t = routes(TABLE);
        // `reads` would match a GET, and an unfenced catch-all would match a
        // PUT; an encoded space is canonical but not a key character.
        let unfenced = routes(&format!("{TABLE}\n- {{ name: writes, path: '/{{*rest}}', fence: off }}\n"));
        assert_eq!(find(&unfenced, "PUT", "/elsewhere/a%20b"), found("writes", None));
        assert_eq!(find(&unfenced, "PUT", "/racks/a%20b"), Err(invalid_key("rack-writes", "rack/a%20b")));
        assert_eq!(find(&t, "GET", "/racks/a%20b"), found("reads", None));
        // `%3A` is `:`, but the key is made of the text as sent: refused, not decoded.
        assert_eq!(find(&unfenced, "PUT", "/racks/a%3Ab"), Err(invalid_key("rack-writes", "rack/a%3Ab")));
        let long = format!("/racks/{}", "x".repeat(300));
        let Err(MatchError::InvalidKey { key, .. }) = t.find(&Method::PUT, &long) else { panic!("long key accepted") };
        assert_eq!(key.len(), validate::MAX_KEY_LEN);
        let e = t.find(&Method::PUT, "/racks/a!b").unwrap_err().to_string();
        assert!(e.contains("rack-writes") && e.contains("rack/a!b"), "{e}");
    }

    #[test]
    fn no_route() {
        let t = routes(TABLE);
        assert_eq!(find(&t, "POST", "/elsewhere"), Err(MatchError::NoRoute));
        assert_eq!(find(&t, "PATCH", "/racks/1/slots"), Err(MatchError::NoRoute));
        let t = routes("[{ name: a, methods: [GET], path: /a, fence: off }]");
        assert_eq!(find(&t, "GET", "/a"), found("a", None));
        assert_eq!(find(&t, "GET", "/a/"), found("a", None));
        assert_eq!(find(&t, "GET", "/b"), Err(MatchError::NoRoute));
        assert_eq!(find(&t, "GET", "/a/b"), Err(MatchError::NoRoute));
        assert_eq!(find(&t, "GET", "/"), Err(MatchError::NoRoute));
    }

    #[test]
    fn malformed_paths_are_refused_before_matching() {
        let t = routes(TABLE);
        for path in [
            "",
            "racks/42",
            "*",
            "//",
            "//racks/42",
            "/racks//42",
            "/racks/42//",
            "/./racks/42",
            "/racks/./42",
            "/racks/42/.",
            "/racks/../racks/42",
            "/racks/42/..",
            "/racks/%2e%2e/x",
            "/racks/%2E/42",
            "/racks/4%2F2",
            "/racks/4%2f2",
            "/racks%2F42",
            "/racks/4%5C2",
            "/racks/%34%32",
            "/r%61cks/42",
            "/racks/%7E",
            "/racks/%2D",
            "/racks/%5F",
            "/racks/42%",
            "/racks/42%2",
            "/racks/%zz",
            "/racks/%%32",
            "/racks/4%252",
            "/racks/4%00",
            "/racks/42%0A",
            "/racks/4%7F",
            "/racks/4\\2",
            "/racks\\42",
            "/racks;x/42",
            "/racks/42;jsessionid=1",
            "/racks/4\n2",
            "/racks/4\t2",
            "/racks/4\u{0}2",
            "/racks/4 2",
            "/racks/4\u{7f}2",
            "/racks/ä",
            "/racks/%C0%AE%C0%AE",
            "/racks/%FF",
            "/racks/%C3",
        ] {
            for method in ["PUT", "GET"] {
                let got = find(&t, method, path);
                assert!(matches!(got, Err(MatchError::MalformedPath(_))), "{method} {path:?} -> {got:?}");
            }
        }
        let e = t.find(&Method::GET, "/racks/%2e%2e/x").unwrap_err().to_string();
        assert!(e.contains("%2e") && e.contains("unreserved"), "{e}");
        let e = t.find(&Method::GET, "/a\n").unwrap_err().to_string();
        assert!(e.contains("\\n") && !e.contains('\n'), "control characters are escaped: {e}");
    }

    #[test]
    fn encoded_characters_that_are_not_unreserved_are_canonical() {
        let t = routes(TABLE);
        for path in ["/racks/a%20b", "/racks/%C3%A9", "/racks/a%3Ab", "/racks/a%2Bb", "/racks/%3F", "/racks/a+b"] {
            assert_eq!(find(&t, "GET", path), found("reads", None), "{path}");
        }
        assert_eq!(find(&t, "GET", "/racks/...."), found("reads", None));
        assert_eq!(find(&t, "GET", "/racks/.hidden"), found("reads", None));
        assert_eq!(find(&t, "PUT", "/racks/..."), found("rack-writes", Some("rack/...")));
    }

    #[test]
    fn literals_match_whatever_the_encoding_of_reserved_characters() {
        let t = routes(TABLE);
        for path in ["/v1/items:batch", "/v1/items%3Abatch", "/v1/items%3abatch/"] {
            assert_eq!(find(&t, "POST", path), found("batch", Some("items")), "{path}");
        }
        let t = routes("[{ name: sp, path: '/a%20b/{id}', lock_key: 'k/{id}' }]");
        assert_eq!(find(&t, "PUT", "/a%20b/1"), found("sp", Some("k/1")));
        assert_eq!(find(&t, "PUT", "/a%20B/1"), found("sp", Some("k/1")), "literals ignore case");
    }

    /// Every spelling a lenient upstream would take for rack 42 is fenced
    /// as rack/42, or refused: never forwarded unfenced.
    #[test]
    fn case_insensitive_literals_typed_ids_and_no_unfenced_writes_on_fenced_paths() {
        let t = routes(TABLE);
        for path in ["/RACKS/42", "/Racks/42", "/rAcKs/42/"] {
            assert_eq!(find(&t, "PUT", path), found("rack-writes", Some("rack/42")), "{path}");
        }
        assert_eq!(find(&t, "GET", "/RACKS/42"), found("reads", None), "reads stay unfenced");
        // PURGE, MOVE, ... are not listed on rack-writes: the catch-all would
        // take them, but `reads` is GET/HEAD only and there is no other: so
        // none matches... and with a catch-all for every method, refused.
        let open = routes(&format!("{TABLE}- {{ name: any, path: '/{{*rest}}', fence: off }}\n"));
        for method in ["PURGE", "MOVE", "COPY", "PROPPATCH", "MERGE", "PUTT"] {
            let e = find(&open, method, "/racks/42").unwrap_err();
            assert!(
                matches!(&e, MatchError::UnfencedWrite { fenced, through, .. } if fenced == "rack-writes" && through == "any"),
                "{method}: {e:?}"
            );
        }
        assert_eq!(find(&open, "GET", "/racks/42"), found("reads", None));
        assert_eq!(find(&open, "OPTIONS", "/racks/42"), found("any", None), "safe methods pass");
        assert_eq!(find(&open, "PURGE", "/other/42"), found("any", None), "not a fenced path");
        let allowed =
            routes(&format!("{TABLE}- {{ name: any, path: '/{{*rest}}', fence: off, allow_unfenced_writes: true }}\n"));
        assert_eq!(find(&allowed, "PURGE", "/racks/42"), found("any", None), "said in so many words");
        let e = build_err("[{ name: r, path: '/r/{x}', lock_key: 'r/{x}', allow_unfenced_writes: true }]");
        assert!(e.contains("allow_unfenced_writes"), "{e}");
        let typed = routes("[{ name: r, path: '/racks/{rack:int}', lock_key: 'rack/{rack}' }]");
        for (path, key) in [
            ("/racks/42", "rack/42"),
            ("/racks/042", "rack/42"),
            ("/racks/0042", "rack/42"),
            ("/racks/0", "rack/0"),
            ("/racks/000", "rack/0"),
        ] {
            assert_eq!(find(&typed, "PUT", path), found("r", Some(key)), "{path}");
        }
        for path in
            ["/racks/42.json", "/racks/42.", "/racks/42.0", "/racks/-1", "/racks/4x", "/racks/123456789012345678901"]
        {
            assert!(matches!(find(&typed, "PUT", path), Err(MatchError::BadParam { .. })), "{path}");
        }
        assert!(build_err("[{ name: r, path: '/racks/{rack:float}', lock_key: 'rack/{rack}' }]")
            .contains("unknown parameter type"));
    }

    /// `{name:slug}` is read in lower case; listed format suffixes are
    /// stripped before matching, unlisted ones refused by typed parameters;
    /// typed values before a `{*rest}` are canonical too.
    #[test]
    fn slugs_suffixes_and_typed_values_before_a_rest() {
        let t = routes(concat!(
            "[{ name: host, path: '/hosts/{name:slug}', lock_key: 'host/{name}', suffixes: [json, .XML] },",
            " { name: rack, path: '/racks/{rack:int}/{*rest}', lock_key: 'rack/{rack}' },",
            " { name: file, path: '/files/{*path}', lock_key: 'file/{path}', suffixes: [json] },",
            " { name: any, path: '/{*rest}', fence: off }]"
        ));
        for (path, key) in [
            ("/hosts/web-01", "host/web-01"),
            ("/hosts/Web-01", "host/web-01"),
            ("/HOSTS/WEB_01/", "host/web_01"),
            ("/hosts/web-01.json", "host/web-01"),
            ("/hosts/web-01.JSON", "host/web-01"),
            ("/hosts/web-01.xml", "host/web-01"),
        ] {
            assert_eq!(find(&t, "PUT", path), found("host", Some(key)), "{path}");
        }
        for path in ["/hosts/web.01", "/hosts/web-01.yaml", "/hosts/web-01.json.json", "/hosts/.json", "/hosts/w%20b"] {
            assert!(
                matches!(find(&t, "PUT", path), Err(MatchError::BadParam { .. } | MatchError::MalformedPath(_))),
                "{path}: {:?}",
                find(&t, "PUT", path)
            );
        }
        assert!(matches!(find(&t, "PUT", "/hosts/.json"), Err(MatchError::BadParam { .. })), "not a whole name");
        assert_eq!(find(&t, "PUT", "/racks/042/slots/1"), found("rack", Some("rack/42")));
        assert_eq!(find(&t, "PUT", "/files/a/b.json"), found("file", Some("file/a/b")));
        assert_eq!(find(&t, "PUT", "/files/a/b.txt"), found("file", Some("file/a/b.txt")));
        for (suffixes, says) in [
            ("['']", "letters and digits"),
            ("['js on']", "letters and digits"),
            ("[json, JSON]", "twice"),
            ("['.']", "letters and digits"),
        ] {
            let e = build_err(&format!("[{{ name: r, path: '/r/{{x}}', lock_key: 'r/{{x}}', suffixes: {suffixes} }}]"));
            assert!(e.contains("`routes[0].suffixes`") && e.contains(says), "{suffixes}: {e}");
        }
    }

    /// Segments are cut at every `/` (empty ones too: `canonical` refuses
    /// them), each with its offset for `{*rest}`; an empty path has none.
    #[test]
    fn segments_are_cut_at_every_slash_with_their_offsets() {
        for (body, cut) in [
            ("", vec![]),
            ("a", vec![(0, "a")]),
            ("racks/42", vec![(0, "racks"), (6, "42")]),
            ("a//b", vec![(0, "a"), (2, ""), (3, "b")]),
            ("a/", vec![(0, "a"), (2, "")]),
            ("/a", vec![(0, ""), (1, "a")]),
        ] {
            assert_eq!(Segments::new(body).collect::<Vec<_>>(), cut, "{body:?}");
        }
    }

    /// An override is taken only where both methods take the same route and
    /// it allows overrides.
    #[test]
    fn a_method_override_needs_one_route_for_both_methods_that_allows_it() {
        let t = routes(concat!(
            "[{ name: w, methods: [POST, PATCH, DELETE], path: '/racks/{rack:int}', lock_key: 'rack/{rack}',",
            "   allow_method_override: true },",
            " { name: plain, methods: [POST, PUT], path: '/plain/{rack:int}', lock_key: 'plain/{rack}' },",
            " { name: any, path: '/{*rest}', fence: off }]"
        ));
        let over = |m: &str, e: &str, p: &str| {
            t.find_overridden(&Method::from_bytes(m.as_bytes()).unwrap(), &Method::from_bytes(e.as_bytes()).unwrap(), p)
                .map(|m| (m.route.name.clone(), m.key))
        };
        assert_eq!(over("POST", "PATCH", "/racks/042"), Ok(("w".into(), Some("rack/42".into()))));
        assert_eq!(over("POST", "DELETE", "/RACKS/1"), Ok(("w".into(), Some("rack/1".into()))));
        for (m, e, p, says) in [
            ("POST", "GET", "/racks/1", "different routes"),
            ("GET", "PATCH", "/racks/1", "different routes"),
            ("POST", "PUT", "/racks/1", "refused"),
            ("POST", "PUT", "/plain/1", "does not allow"),
            ("POST", "DELETE", "/other", "does not allow"),
            ("POST", "GET", "/other", "does not allow"),
        ] {
            let e = over(m, e, p).unwrap_err();
            assert!(matches!(&e, MatchError::MethodOverride { why, .. } if why.contains(says)), "{m} {p}: {e:?}");
        }
    }

    #[test]
    fn template_errors() {
        for (route, field, says) in [
            ("{ name: r, path: 'racks/{id}', lock_key: 'k/{id}' }", "path", "must start with /"),
            ("{ name: r, path: '/racks/{id}/', lock_key: 'k/{id}' }", "path", "must not end with /"),
            ("{ name: r, path: '/racks//{id}', lock_key: 'k/{id}' }", "path", "empty segment"),
            ("{ name: r, path: '/racks/{id}.json', lock_key: 'k/{id}' }", "path", "whole segment"),
            ("{ name: r, path: '/racks/x{id}', lock_key: 'k/{id}' }", "path", "whole segment"),
            ("{ name: r, path: '/racks/{}', fence: off }", "path", "parameter name"),
            ("{ name: r, path: '/racks/{a-b}', fence: off }", "path", "parameter name"),
            ("{ name: r, path: '/racks/{*}', fence: off }", "path", "parameter name"),
            ("{ name: r, path: '/{*a}/{b}', fence: off }", "path", "last segment"),
            ("{ name: r, path: '/{a}/{*a}', fence: off }", "path", "twice"),
            ("{ name: r, path: '/racks/../x', fence: off }", "path", "dot segment"),
            ("{ name: r, path: '/racks/%41', fence: off }", "path", "unreserved"),
            ("{ name: r, path: '/racks/a b', fence: off }", "path", "space"),
            ("{ name: r, path: '/racks;v=1', fence: off }", "path", "';'"),
            ("{ name: r, path: '/racks/{id}' }", "lock_key", "required"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'k', fence: off }", "lock_key", "must not be set"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'k/{rack}' }", "lock_key", "not a parameter"),
            ("{ name: r, path: '/racks/{*id}', lock_key: 'k/{*id}' }", "lock_key", "not {*id}"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'k/{id' }", "lock_key", "without a '}'"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'k/id}' }", "lock_key", "without a '{'"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'k//{id}' }", "lock_key", "never be a valid"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'k/{id}/' }", "lock_key", "never be a valid"),
            ("{ name: r, path: '/racks/{id}', lock_key: '' }", "lock_key", "never be a valid"),
            ("{ name: r, path: '/racks/{id}', lock_key: 'rack {id}' }", "lock_key", "never be a valid"),
            ("{ name: r, methods: [], path: /x, fence: off }", "methods", "empty"),
            ("{ name: r, methods: [get], path: /x, fence: off }", "methods", "upper-case"),
            ("{ name: r, methods: ['PUT '], path: /x, fence: off }", "methods", "upper-case"),
            ("{ name: r, methods: ['P(UT'], path: /x, fence: off }", "methods", "upper-case"),
            ("{ name: r, methods: [''], path: /x, fence: off }", "methods", "upper-case"),
            ("{ name: r, methods: [GET, PUT, GET], path: /x, fence: off }", "methods", "twice"),
        ] {
            let e = build_err(&format!("[{{ name: ok, path: /ok, fence: off }}, {route}]"));
            assert!(e.contains(&format!("`routes[1].{field}`")) && e.contains(says), "{route}: {e}");
        }
        // Custom methods are fine if they are tokens.
        let t = routes("[{ name: r, methods: [PURGE, M-SEARCH], path: /x, fence: off }]");
        assert_eq!(find(&t, "M-SEARCH", "/x"), found("r", None));
    }

    /// What a lenient upstream may make of a path: decode escapes it likes
    /// (twice), read `\` as `/`, drop `;params`, resolve empty and dot segments.
    fn lenient(path: &str) -> String {
        let decode_some = |p: &str| {
            let b = p.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < b.len() {
                match hex_byte(b.get(i + 1..i + 3)) {
                    Some(v) if b[i] == b'%' && (v.is_ascii_alphanumeric() || b"-._~/\\%".contains(&v)) => {
                        out.push(v);
                        i += 3;
                    }
                    _ => {
                        out.push(b[i]);
                        i += 1;
                    }
                }
            }
            String::from_utf8(out).unwrap()
        };
        let p = decode_some(&decode_some(path)).replace('\\', "/");
        let mut out: Vec<&str> = Vec::new();
        for segment in p.split('/').map(|s| s.split(';').next().unwrap()) {
            match segment {
                "" | "." => {}
                ".." => {
                    out.pop();
                }
                s => out.push(s),
            }
        }
        format!("/{}", out.join("/"))
    }

    proptest::proptest! {
        /// The point of refusing non-canonical paths: whatever a lenient
        /// upstream makes of an accepted path, it takes the same route and key.
        #[test]
        fn accepted_paths_mean_the_same_to_a_lenient_upstream(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "/", "racks", "42", "files", "v1", "items:batch", "slots", ".", "..", "%2e", "%2E", "%2f", "%2F",
                "%34", "%32", "%3A", "%3a", "%5C", "%25", "%20", ";x", "\\", "a",
            ]), 0..8),
            put in proptest::bool::ANY,
        ) {
            let t = routes(&format!("{TABLE}\n- {{ name: writes, path: '/{{*rest}}', fence: off }}\n"));
            let path = format!("/{}", parts.concat());
            let method = if put { "PUT" } else { "GET" };
            let got = find(&t, method, &path);
            if !matches!(got, Err(MatchError::MalformedPath(_))) {
                proptest::prop_assert_eq!(got, find(&t, method, &lenient(&path)), "{} vs {}", path, lenient(&path));
            }
        }

        /// A lenient framework (routes ignoring case, `parseInt` on ids, which
        /// reads `042` and `42.json` as 42) writes to rack N: the sidecar
        /// fences that write with `rack/N`, or refuses it. Never another key,
        /// never unfenced.
        #[test]
        fn a_write_a_lenient_upstream_applies_to_rack_n_is_fenced_as_rack_n_or_refused(
            method in proptest::sample::select(vec!["PUT", "POST", "PATCH", "DELETE", "PURGE", "MOVE", "GET"]),
            upper in proptest::collection::vec(proptest::bool::ANY, 5),
            zeros in 0usize..4,
            n in 0u64..100_000,
            suffix in proptest::sample::select(vec!["", ".json", ".JSON", ".", ".0", "x", "-1", ".json.json", ".xml"]),
            slash in proptest::bool::ANY,
        ) {
            let t = routes(concat!(
                "[{ name: r, methods: [PUT, POST, PATCH, DELETE], path: '/racks/{rack:int}', lock_key: 'rack/{rack}',",
                " suffixes: [json] },",
                " { name: any, path: '/{*rest}', fence: off }]"
            ));
            let literal: String = "racks".chars().zip(&upper).map(|(c, u)| if *u { c.to_ascii_uppercase() } else { c }).collect();
            let id = format!("{}{n}{suffix}", "0".repeat(zeros));
            let path = format!("/{literal}/{id}{}", if slash { "/" } else { "" });
            // The lenient upstream: case-insensitive route, parseInt(id).
            let digits: String = id.chars().take_while(char::is_ascii_digit).collect();
            let rack: Option<u64> = digits.parse().ok();
            let write = method != "GET";
            match (find(&t, method, &path), rack) {
                (Ok((route, key)), Some(rack)) if write => {
                    proptest::prop_assert_eq!((route.as_str(), key), ("r", Some(format!("rack/{rack}"))), "{} {}", method, path);
                }
                (Ok((route, _)), _) if write => proptest::prop_assert!(route == "r", "{} {} went through {}", method, path, route),
                _ => {} // refused, or a read
            }
        }
    }
}
