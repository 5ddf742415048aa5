//! The Lock API v1 (docs/DESIGN.md): routing and handlers. Request and
//! answer bodies are the `fencegate_client::wire` types.
//!
//! Calls that must see the leader's state (acquire, keepalive, release, the
//! linearizable read) are handled on the leader; any other node forwards them
//! there once (`forward`), with the identity it authenticated. Watch,
//! cluster, metrics and health are answered by the node itself.
//!
//! Every call but health and metrics has an identity (`credentials`) and
//! needs a right on its key (`auth::Acl`); a lease's keepalive and release
//! need its owner, or an admin (a revocation). Refusals change nothing and
//! are audited.
//!
//! A request's life: validate the input (bad input is refused before
//! anything is proposed and never writes to the log), check the identity,
//! rights (`Caller::may`), lease ownership (`may_use`) and quotas, forward
//! to the leader if needed, then either propose a `Command` through
//! `proposer` (acquire, release) or confirm leadership in a quorum round
//! that started after the call arrived and answer from the applied state
//! (keepalive, the linearizable read, `GET /v1/revision`, which a sidecar's
//! probe reads); a keepalive writes no log entry. A release is proposed at
//! once if the leader has applied its lease and the caller may release it;
//! otherwise it is looked up after such a round (and proposed if found), so
//! that unknown lease ids write nothing to the log. Acquires that must wait
//! park in `waitlist` (the acquire wait loop).
//!
//! Two planes (`Plane`): the client plane has no `/raft/*` (404); the peer
//! plane has only Raft, forwarded leader calls (with the identity the
//! forwarding member authenticated) and `/v1/cluster`. Where identities mean
//! something (clients authenticate, or an ACL), nothing on the peer plane is
//! served to a sender that did not prove to be another member, by
//! certificate with TLS, else by the peer secret (`proven_member`, checked at
//! the plane's entry, before any body is read); a forwarded identity is
//! taken only from a proven member, never from a bare header. Without TLS, a
//! `peer_listen` outside loopback is refused unless the config says
//! `insecure_peers: true`. Bodies are `wire` types: no JSON is written by
//! hand.

use std::sync::Arc;
use std::time::Duration;

use fencegate_client::wire::{self, AcquireRequest, ClusterInfo, Granted, KeepaliveAck, LockInfo, Member, Released};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::time::Instant;

use super::credentials::Credential;
use super::error::ApiError;
use super::proposer::RaftCallError;
use super::{forward, members, openapi, raft_rpc, table, ui, watch, Node};
use crate::audit;
use crate::auth::{Acl, Right};
use crate::backup;
use crate::config::node::LeaseConfig;
use crate::http::{full, json, parse_json, read_body, Body, Conn};
use crate::lock::state::{AcquireCmd, Command, Grant, Outcome};
use crate::lock::validate::{self, InvalidInput};
use crate::raft::identity::CLUSTER_HEADER;

/// Largest Lock API request body.
const MAX_API_BODY: usize = 64 << 10;

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plane {
    /// `listen`: the Lock API for clients. No Raft.
    Client,
    /// `peer_listen`: Raft RPCs, leader calls forwarded by followers, and
    /// `GET /v1/cluster` (the bootstrap check). Nothing else.
    Peer,
}

pub(super) async fn handle(node: Arc<Node>, plane: Plane, req: Request<Incoming>, conn: Conn) -> Response<Body> {
    let routed = match plane {
        Plane::Client => client(node.clone(), req, &conn).await,
        Plane::Peer => peer(node.clone(), req, &conn).await,
    };
    let mut answer = routed.unwrap_or_else(ApiError::into_response);
    // Every answer says which history it is of (`raft::identity`).
    if let Some(id) = node.identity.header() {
        answer.headers_mut().insert(CLUSTER_HEADER, id);
    }
    answer
}

/// The client plane: health, metrics and the API's description for anyone
/// (supervisors, scrapers and code generators carry no credentials; the
/// description is public), the Lock API for an identity.
async fn client(node: Arc<Node>, req: Request<Incoming>, conn: &Conn) -> Result<Response<Body>, ApiError> {
    match req.uri().path() {
        "/healthz" => {
            only(req.method(), "GET")?;
            return core_running(&node).map(|()| text("ok\n", "text/plain"));
        }
        // Readiness: the core runs and a leader is known (this node, with a
        // quorum behind it, or another: followers forward), so a lock call
        // can be served now.
        // Kubernetes takes an unready node out of the client Service.
        "/readyz" => {
            only(req.method(), "GET")?;
            core_running(&node)?;
            return match node.unready() {
                None => Ok(text("ok\n", "text/plain")),
                Some(why) => Err(ApiError::NoLeader(why)),
            };
        }
        "/metrics" => return only(req.method(), "GET").map(|_| crate::metrics::exposition(&node.registry)),
        wire::OPENAPI_PATH => return only(req.method(), "GET").map(|_| text(openapi::DOCUMENT, openapi::CONTENT_TYPE)),
        // The console's page and scripts hold no data: they read the API
        // with the browser's credentials (`ui`).
        path if ui::under(path) => return Ok(ui::answer(req.method(), path)),
        _ => {}
    }
    if let Some(why) = from_another_site(&req) {
        audit::unauthenticated(conn.addr, why);
        return Err(ApiError::Forbidden(format!("the Lock API refuses {why}")));
    }
    let (identity, credential) = node.credentials.identify(req.headers(), conn).inspect_err(|e| {
        audit::unauthenticated(conn.addr, &e.to_string());
    })?;
    route(node, req, Caller { identity, credential, forwarded: false }).await
}

/// Why a request is a browser's on behalf of another site, if it is. The
/// console (`/ui`) only reads, from its own origin; but a browser holding
/// a client certificate presents it to whichever page makes it ask, so a
/// page elsewhere could take a lock as the operator (a form's POST needs
/// no script). Browsers say where a request comes from: `Origin` on every
/// POST and DELETE (no other client sends it), `Sec-Fetch-Site` on all.
fn from_another_site(req: &Request<Incoming>) -> Option<&'static str> {
    let headers = req.headers();
    if req.method() != Method::GET && headers.contains_key(hyper::header::ORIGIN) {
        return Some("a write from a browser (an Origin header): the console only reads");
    }
    match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
        Some(b"cross-site" | b"same-site") => Some("a browser's request made by another site (Sec-Fetch-Site)"),
        _ => None,
    }
}

async fn peer(node: Arc<Node>, req: Request<Incoming>, conn: &Conn) -> Result<Response<Body>, ApiError> {
    // With TLS or a peer secret, nothing on the peer plane is for anyone
    // but a member: a certificate of the same CA that names no member (a
    // client's), or a request without a proof of the secret, is refused
    // before any body is read. Without either, the config said no identity
    // means anything here (`NodeConfig::peers_must_authenticate`).
    let member = match (node.tls, &node.peer_secrets) {
        (true, _) => Some(certified_member(&node, conn)?),
        (false, Some(secrets)) => Some(proven_member(&node, &secrets.load(), req.headers(), conn)?),
        (false, None) => None,
    };
    let path = req.uri().path();
    if let Some(rpc) = path.strip_prefix("/raft/") {
        only(req.method(), "POST")?;
        peer_protocol(req.headers())?;
        let rpc = rpc.to_string();
        let cluster = match req.headers().get(CLUSTER_HEADER).map(|v| v.to_str()) {
            None => None,
            Some(Ok(id)) => Some(id.to_string()),
            Some(Err(_)) => return Err(ApiError::BadRequest(format!("{CLUSTER_HEADER} is not text"))),
        };
        let body = body_within(&node, req.into_body(), super::MAX_PEER_BODY).await?;
        return raft_rpc::handle(&node, &rpc, &body, member, cluster.as_deref(), conn).await;
    }
    if path == wire::CLUSTER_PATH {
        return only(req.method(), "GET").map(|_| cluster(&node));
    }
    if let Some(by) = req.headers().get(forward::FORWARDED_BY) {
        // The member that forwarded it authenticated the client, and only
        // a member may say so: with TLS, the one its certificate names.
        let by = by.to_str().ok().and_then(|b| b.parse::<u64>().ok());
        if member.is_some_and(|m| by != Some(m)) {
            audit::peer_refused(conn.addr, "a forwarded call from another member than the one it proved to be");
            return Err(ApiError::Forbidden("forwarded by another member than the one it proved to be".into()));
        }
        let identity = forward::identity(req.headers())?;
        // From a sender that proved nothing, the header is never taken as
        // truth: on such a node every client is anonymous anyway.
        if member.is_none() && identity != crate::auth::ANONYMOUS {
            audit::peer_refused(conn.addr, &format!("a forwarded call as {identity} from an unauthenticated peer"));
            return Err(ApiError::Forbidden(format!(
                "a forwarded identity ({identity}) is taken only from an authenticated member"
            )));
        }
        // Its token, if any, is checked again by the member that holds it.
        return route(node, req, Caller { identity, credential: Credential::Lasting, forwarded: true }).await;
    }
    Err(ApiError::NotFound)
}

/// Refuse a peer RPC of a newer protocol than this build's (an upgrade
/// half done the wrong way round: the newer nodes must not be misread).
fn peer_protocol(headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    use crate::raft::network::PROTOCOL_HEADER;
    use crate::raft::upgrade::PROTOCOL;
    let Some(v) = headers.get(PROTOCOL_HEADER) else { return Ok(()) };
    match v.to_str().ok().and_then(|v| v.parse::<u32>().ok()) {
        Some(v) if v <= PROTOCOL => Ok(()),
        Some(v) => {
            tracing::warn!(
                protocol = v,
                "refused a peer of a newer protocol than this node's ({PROTOCOL}): upgrade this node"
            );
            Err(ApiError::BadRequest(format!(
                "peer protocol {v} is newer than this node's ({PROTOCOL}): upgrade this node"
            )))
        }
        None => Err(ApiError::BadRequest(format!("{PROTOCOL_HEADER} is not a number"))),
    }
}

/// The member (other than this node) the connection's certificate names,
/// worked out once per connection.
fn certified_member(node: &Node, conn: &Conn) -> Result<u64, ApiError> {
    // Only a member found is kept: a member just added may be unknown here
    // a moment longer than its connection.
    let named = match conn.named.get() {
        Some(Some(id)) => Some(id.clone()),
        _ => {
            let found = conn.leaf().and_then(|cert| {
                let mut others = node.known().into_iter().filter(|id| *id != node.id);
                others.find(|id| crate::tls::identity::certifies_member(cert, *id)).map(|id| id.to_string())
            });
            if let Some(id) = &found {
                let _ = conn.named.set(Some(id.clone()));
            }
            found
        }
    };
    named.as_deref().and_then(|id| id.parse().ok()).ok_or_else(|| {
        audit::peer_refused(conn.addr, "a certificate that names no other member");
        ApiError::Forbidden("the peer plane is for members: the certificate names none".into())
    })
}

/// The member (other than this node) whose proof of the peer secret the
/// request carries (`Authorization: Bearer <id>.<mac>`, `auth::PeerSecrets`).
fn proven_member(
    node: &Node,
    secrets: &crate::auth::PeerSecrets,
    headers: &hyper::HeaderMap,
    conn: &Conn,
) -> Result<u64, ApiError> {
    let proof = headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()?.strip_prefix("Bearer "));
    let Some(id) = proof.and_then(|p| secrets.member(p.trim())) else {
        audit::peer_refused(conn.addr, "no valid proof of the peer secret");
        return Err(ApiError::Unauthorized("the peer plane is for members: prove the peer secret".into()));
    };
    if id == node.id || !node.knows(id) {
        audit::peer_refused(conn.addr, &format!("a proof of the peer secret as {id}, no other member"));
        return Err(ApiError::Forbidden(format!("the peer plane is for members: {id} is no other member")));
    }
    Ok(id)
}

/// Who is calling the Lock API.
struct Caller {
    identity: String,
    /// What it was let in on: a long-lived call ends when it is revoked.
    credential: Credential,
    /// A follower sent it on the peer plane, so it is not forwarded again.
    forwarded: bool,
}

impl Caller {
    /// `Ok` if the caller has `right` on `key`; audited otherwise.
    fn may(&self, node: &Node, right: Right, key: &str) -> Result<(), ApiError> {
        if node.acl.load().allows(&self.identity, right, key) {
            return Ok(());
        }
        audit::denied(&self.identity, right, key, "no such right");
        Err(ApiError::Forbidden(format!("{} may not {} {key}", self.identity, right.as_str())))
    }

    /// Resolves once the caller may go on no longer: its token revoked, or
    /// `allowed` false under the ACL then in force (see `credentials`).
    fn lost<'a, N>(
        &self,
        node: N,
        allowed: impl Fn(&Acl, &str) -> bool + Send + 'a,
    ) -> impl std::future::Future<Output = ApiError> + Send + 'a
    where
        N: std::ops::Deref<Target = Node> + Send + 'a,
    {
        let credentials = node.credentials.clone();
        credentials.lost(self.identity.clone(), self.credential, move |identity| allowed(&node.acl.load(), identity))
    }
}

/// The Lock API.
async fn route(node: Arc<Node>, req: Request<Incoming>, caller: Caller) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match path.as_str() {
        wire::CLUSTER_PATH => return only(&method, "GET").map(|_| cluster(&node)),
        wire::WATCH_PATH => {
            only(&method, "GET")?;
            let (rules, identity) = (node.clone(), caller.identity.clone());
            let may_open = |prefix: &str| match node.acl.load().reaches(&caller.identity, Right::Watch, prefix) {
                true => Ok(()),
                false => caller.may(&node, Right::Watch, prefix),
            };
            // The rules in force at each event: a reload that takes a right
            // away hides the keys from open streams too.
            let visible = Box::new(move |key: &str| rules.acl.load().allows(&identity, Right::Watch, key));
            // And a stream whose token is revoked, or that may watch
            // nothing under its prefix any more, ends.
            let ends = |prefix: &str| {
                let prefix = prefix.to_string();
                caller.lost(node.clone(), move |acl, identity| acl.reaches(identity, Right::Watch, &prefix))
            };
            return watch::stream(node.clone(), req.uri().query(), may_open, visible, ends).await;
        }
        _ => {}
    }
    // Leader calls.
    let call = call(&method, &path, req.uri().query())?;
    // Refused before the body is read or anything is forwarded.
    match &call {
        Call::Acquire(key) => caller.may(&node, Right::Acquire, key)?,
        Call::Read(key) => caller.may(&node, Right::Read, key)?,
        // Listed then are only the keys it may read.
        Call::List { prefix, .. } => {
            if !node.acl.load().reaches(&caller.identity, Right::Read, prefix) {
                caller.may(&node, Right::Read, prefix)?
            }
        }
        // What every watch stream's heartbeat shows: for whoever may watch something.
        Call::Revision => {
            if !node.acl.load().reaches(&caller.identity, Right::Watch, "") {
                caller.may(&node, Right::Watch, "")?
            }
        }
        // Membership is the whole cluster's: admin on every key, and so are membership and the backup of every key.
        Call::Members | Call::AddMember | Call::RemoveMember { .. } | Call::Snapshot => {
            caller.may(&node, Right::Admin, "")?
        }
        // Need the lease's key and owner: checked on the leader.
        Call::Keepalive(_) | Call::Release(_) => {}
    }
    let received = Instant::now();
    let (parts, body) = req.into_parts();
    let body = body_within(&node, body, MAX_API_BODY).await?;

    match node.leader() {
        Some(leader) if leader == node.id => {}
        Some(leader) if !caller.forwarded => {
            // A forwarded acquire may wait there: answered 401 here once its
            // token is revoked (the leader's grant, if any, then expires).
            let lost = caller.lost(&*node, |_, _| true);
            tokio::select! {
                answer = forward::to_leader(&node, leader, &parts, body, &caller.identity) => return answer,
                e = lost => return Err(e),
            }
        }
        _ => return Err(ApiError::NoLeader("no leader elected yet, or this node is cut off".into())),
    }
    match call {
        Call::Acquire(key) => acquire(&node, &caller, key, parse_json(&body)?, received).await,
        Call::Read(key) => read(&node, &key).await,
        Call::List { prefix, limit } => {
            linearizable(&node).await?;
            Ok(json(StatusCode::OK, &table::list(&node, &caller.identity, &prefix, limit)))
        }
        Call::Revision => revision(&node).await,
        Call::Keepalive(id) => keepalive(&node, &caller, &id, received).await,
        Call::Release(id) => release(&node, &caller, &id).await,
        Call::Snapshot => snapshot(&node, &caller).await,
        Call::Members => Ok(json(StatusCode::OK, &members::list(&node).await)),
        Call::AddMember => {
            let add = parse_json(&body)?;
            audit::membership(&caller.identity, &format!("{add:?}"));
            Ok(json(StatusCode::OK, &members::add(&node, add).await?))
        }
        Call::RemoveMember { id, force } => {
            audit::membership(&caller.identity, &format!("remove {id} (force: {force})"));
            match members::remove(&node, id, force).await? {
                members::Removal::Done(list) => Ok(json(StatusCode::OK, &list)),
                // The new leader removes this node; a follower may forward.
                members::Removal::HandedOver(to) => forward::to_leader(&node, to, &parts, body, &caller.identity).await,
            }
        }
    }
}

/// Which leader call a request is, from its method, path and query alone
/// (its key decoded and checked, its lease id's form checked): nothing is
/// read, asked or proposed yet. `NotFound` for a path that is none.
pub fn call(method: &Method, path: &str, query: Option<&str>) -> Result<Call, ApiError> {
    if let Some(key) = path.strip_prefix(wire::LOCKS_PATH) {
        let key = lock_key(key)?;
        return match *method {
            Method::POST => Ok(Call::Acquire(key)),
            Method::GET => Ok(Call::Read(key)),
            _ => Err(ApiError::MethodNotAllowed("GET, POST")),
        };
    }
    if let Some(rest) = path.strip_prefix(wire::LEASES_PATH) {
        // Other methods get 405 on either path, whatever the id.
        return match (method, rest.strip_suffix("/keepalive")) {
            (&Method::POST, Some(id)) if lease_id_ok(id) => Ok(Call::Keepalive(id.to_string())),
            (&Method::DELETE, None) if lease_id_ok(rest) => Ok(Call::Release(rest.to_string())),
            (&Method::POST, Some(_)) | (&Method::DELETE, None) => Err(ApiError::LeaseNotFound),
            (_, Some(_)) => Err(ApiError::MethodNotAllowed("POST")),
            (_, None) => Err(ApiError::MethodNotAllowed("DELETE")),
        };
    }
    if path == wire::LOCK_TABLE_PATH {
        only(method, "GET")?;
        let (prefix, limit) = table::params(query)?;
        return Ok(Call::List { prefix, limit });
    }
    if path == wire::SNAPSHOT_PATH {
        return only(method, "GET").map(|()| Call::Snapshot);
    }
    if path == wire::REVISION_PATH {
        return only(method, "GET").map(|()| Call::Revision);
    }
    if path == wire::MEMBERS_PATH {
        return match *method {
            Method::GET => Ok(Call::Members),
            Method::POST => Ok(Call::AddMember),
            _ => Err(ApiError::MethodNotAllowed("GET, POST")),
        };
    }
    if let Some(id) = path.strip_prefix(wire::MEMBERS_PATH).and_then(|p| p.strip_prefix('/')) {
        let id = id.parse().map_err(|_| ApiError::BadRequest(format!("{id:?} is not a node id")))?;
        let force = match query {
            None => false,
            Some("force=true") => true,
            Some(q) => return Err(ApiError::BadRequest(format!("unknown query {q:?} (only force=true)"))),
        };
        only(method, "DELETE")?;
        return Ok(Call::RemoveMember { id, force });
    }
    Err(ApiError::NotFound)
}

/// The whole body, within the node's `limits.body_timeout`: a client that
/// announces a body and never sends it does not hold the request forever.
async fn body_within(node: &Node, body: Incoming, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let within = node.config.limits.body_timeout;
    tokio::time::timeout(within, read_body(body, limit))
        .await
        .map_err(|_| ApiError::BodyTimeout(within))?
        .map_err(Into::into)
}

/// A leader call (`call`), with what its path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Acquire(String),
    Read(String),
    List { prefix: String, limit: usize },
    Revision,
    Keepalive(String),
    Release(String),
    Snapshot,
    Members,
    AddMember,
    RemoveMember { id: u64, force: bool },
}

/// Liveness: 503 `unavailable` once the Raft core has stopped.
fn core_running(node: &Node) -> Result<(), ApiError> {
    match node.core_error() {
        None => Ok(()),
        Some(e) => Err(ApiError::Unavailable(format!("the Raft core stopped: {e}"))),
    }
}

/// `Ok` for the one method a path takes; 405 naming it otherwise.
fn only(method: &Method, allowed: &'static str) -> Result<(), ApiError> {
    if method.as_str() == allowed {
        Ok(())
    } else {
        Err(ApiError::MethodNotAllowed(allowed))
    }
}

/// The key of a `/v1/locks/{key}` path: percent-decoded once (generated
/// clients encode path parameters, so `rack/42` arrives as `rack%2F42`),
/// then checked. Decoding first cannot smuggle anything past the check: the
/// key's alphabet has no `%`, and `.` and `..` segments are refused either way.
fn lock_key(raw: &str) -> Result<String, ApiError> {
    let key = String::from_utf8(crate::percent::decode(raw)).map_err(|_| InvalidInput::Key(raw.into()))?;
    validate::key(&key)?;
    Ok(key)
}

fn lease_id_ok(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn text(body: impl Into<bytes::Bytes>, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn cluster(node: &Node) -> Response<Body> {
    let m = node.raft.metrics().borrow().clone();
    // Clients are told where each member's client API is (`clients`), never
    // its peer plane.
    let clients = &node.config.clients;
    let members = node.members().into_iter().map(|id| Member { id, url: clients.get(&id).cloned() }).collect();
    let info = ClusterInfo {
        id: node.id,
        leader: m.current_leader,
        term: m.current_term,
        state: format!("{:?}", m.state),
        members,
        commit_index: m.last_applied.map(|l| l.index).unwrap_or(0),
        last_log_index: m.last_log_index.unwrap_or(0),
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        rules: node.applied.lock().locks.rules(),
        cluster: node.identity.get(),
    };
    json(StatusCode::OK, &info)
}

fn new_lease_id() -> String {
    // 128 bits from the OS-seeded CSPRNG: unguessable, never derived from the token.
    format!("{:032x}", rand::random::<u128>())
}

async fn acquire(
    node: &Node,
    caller: &Caller,
    key: String,
    body: AcquireRequest,
    received: Instant,
) -> Result<Response<Body>, ApiError> {
    let AcquireParams { ttl_ms, wait_ms, lock_delay_ms, holder, request_id } =
        acquire_params(body, &node.config.lease)?;
    within_quotas(node, &key, &caller.identity, request_id.as_deref())?;
    let owner = caller.identity.clone();
    let lease_id = new_lease_id();
    let lost = caller.lost(node, |acl, identity| acl.allows(identity, Right::Acquire, &key));
    let cmd = AcquireCmd { key: key.clone(), owner, holder, ttl_ms, lock_delay_ms, lease_id, request_id };
    let result = wait_for_grant(node, cmd, received + Duration::from_millis(wait_ms), lost).await;
    node.lock_metrics.acquire_duration.observe(received.elapsed().as_secs_f64());
    let g = result?;
    Ok(json(StatusCode::OK, &Granted { key: g.key, token: g.token, lease_id: g.lease_id, ttl_ms: g.ttl_ms }))
}

/// An acquire's body with the defaults of `limits` filled in, each field
/// within its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireParams {
    pub ttl_ms: u64,
    pub wait_ms: u64,
    pub lock_delay_ms: u64,
    pub holder: String,
    pub request_id: Option<String>,
}

/// Check an acquire's body against the node's lease limits; the first field
/// out of bounds is the error.
pub fn acquire_params(body: AcquireRequest, limits: &LeaseConfig) -> Result<AcquireParams, InvalidInput> {
    let ttl_ms = body.ttl_ms.unwrap_or(limits.default_ttl.as_millis() as u64);
    validate::ttl(ttl_ms, limits.min_ttl.as_millis() as u64, limits.max_ttl.as_millis() as u64)?;
    let wait_ms = body.wait_ms.unwrap_or(0);
    validate::at_most("wait_ms", wait_ms, limits.max_wait.as_millis() as u64)?;
    let lock_delay_ms = body.lock_delay_ms.unwrap_or(limits.lock_delay.as_millis() as u64);
    validate::at_most("lock_delay_ms", lock_delay_ms, limits.max_ttl.as_millis() as u64)?;
    let holder = body.holder.unwrap_or_else(|| "anonymous".into());
    validate::holder(&holder)?;
    if let Some(r) = &body.request_id {
        validate::request_id(r)?;
    }
    Ok(AcquireParams { ttl_ms, wait_ms, lock_delay_ms, holder, request_id: body.request_id })
}

/// The quotas of `limits`, checked on the leader before each proposal.
/// Acquires proposed at the same moment may overshoot them by their number:
/// quotas bound memory, not exclusion. A retry of a granted request always
/// gets its grant back.
fn within_quotas(node: &Node, key: &str, identity: &str, request_id: Option<&str>) -> Result<(), ApiError> {
    let limits = &node.config.limits;
    let s = node.applied.lock();
    if matches!(s.locks.admission(key, identity, request_id), Outcome::Granted(_)) {
        return Ok(());
    }
    if s.locks.key(key).is_none() && s.locks.key_count() >= limits.max_keys {
        return Err(ApiError::QuotaExceeded(format!(
            "the lock table holds {} keys (limits.max_keys); idle keys are compacted after {}",
            s.locks.key_count(),
            humantime::format_duration(limits.idle_key_retention)
        )));
    }
    if s.locks.owned_by(identity) >= limits.max_leases_per_identity {
        return Err(ApiError::QuotaExceeded(format!(
            "{identity} holds {} leases (limits.max_leases_per_identity)",
            s.locks.owned_by(identity)
        )));
    }
    Ok(())
}

/// Queue behind earlier waiters for the key, then propose when the key looks
/// free, until granted or `deadline`; or until the caller is `lost` (its
/// token revoked or its right taken away while it waits).
async fn wait_for_grant(
    node: &Node,
    cmd: AcquireCmd,
    deadline: Instant,
    lost: impl std::future::Future<Output = ApiError>,
) -> Result<Grant, ApiError> {
    tokio::pin!(lost);
    let ticket = node.waitlist.join(&cmd.key);
    let mut applied = node.applied.subscribe();
    let mut metrics = node.raft.metrics();
    loop {
        let head_moved = node.waitlist.changed.notified();
        tokio::pin!(head_moved);
        head_moved.as_mut().enable();
        // A retry of a granted request goes straight through: queued behind
        // a waiter for the key its own grant holds, it would never get out.
        // Otherwise only the head of the queue proposes, and only when the
        // key looks free: proposals the state would refuse stay out of the log.
        let admission = node.applied.lock().locks.admission(&cmd.key, &cmd.owner, cmd.request_id.as_deref());
        let try_now = match admission {
            Outcome::Granted(_) => true,
            Outcome::Nothing => node.waitlist.is_head(&ticket),
            _ => false,
        };
        if try_now {
            // Again at each try: waiting must not be a way past a quota.
            within_quotas(node, &cmd.key, &cmd.owner, cmd.request_id.as_deref())?;
            match propose(node, Command::Acquire(cmd.clone())).await? {
                Outcome::Granted(g) => return Ok(g),
                Outcome::Held { .. } => {} // lost a race with the log; wait for the next change
                other => return Err(ApiError::Internal(format!("acquire produced {other:?}"))),
            }
        }
        if Instant::now() >= deadline {
            return Err(held(node, &cmd.key));
        }
        tokio::select! {
            _ = applied.changed() => {}
            _ = &mut head_moved => {}
            changed = metrics.changed() => {
                if changed.is_err() || node.leader() != Some(node.id) {
                    return Err(ApiError::NoLeader("leadership moved while waiting; retry on the new leader".into()));
                }
            }
            _ = tokio::time::sleep_until(deadline) => {}
            e = &mut lost => return Err(e),
            () = node.stopped() => {
                return Err(ApiError::NoLeader("this node is shutting down; retry on another node".into()));
            }
        }
    }
}

fn held(node: &Node, key: &str) -> ApiError {
    let s = node.applied.lock();
    let token = s.locks.key(key).map_or(0, |k| k.token);
    match s.locks.admission(key, "", None) {
        Outcome::Held { key, holder, token, lock_delay } => ApiError::Held { key, holder, token, lock_delay },
        // Freed since the deadline passed: still not granted to this caller.
        _ => ApiError::Held { key: key.to_string(), holder: None, token, lock_delay: false },
    }
}

/// Append a command and wait for it to be applied.
async fn propose(node: &Node, cmd: Command) -> Result<Outcome, ApiError> {
    let timeout = node.config.raft.propose_timeout;
    match tokio::time::timeout(timeout, node.proposer.propose(cmd)).await {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(RaftCallError::NotLeader)) => {
            Err(ApiError::NoLeader("this node stopped being leader; the outcome is unknown".into()))
        }
        Ok(Err(RaftCallError::HandingOver)) => Err(handing_over()),
        Ok(Err(e)) => Err(ApiError::Unavailable(format!("{e}; the outcome is unknown"))),
        Err(_) => Err(ApiError::Unavailable(format!(
            "no quorum within {}; the outcome is unknown",
            humantime::format_duration(timeout)
        ))),
    }
}

/// A paused proposer's refusal: nothing was proposed, so a retry is safe.
fn handing_over() -> ApiError {
    ApiError::NoLeader("this node is handing leadership over; nothing was proposed, retry on the new leader".into())
}

/// Confirm with a quorum that this node is still leader, and wait until its
/// state machine has applied everything committed before now.
async fn linearizable(node: &Node) -> Result<(), ApiError> {
    let timeout = node.config.raft.propose_timeout;
    match tokio::time::timeout(timeout, node.proposer.confirm_leadership()).await {
        Ok(Ok(())) if !started(node) => Err(ApiError::Unavailable("the new leader is still starting".into())),
        Ok(Ok(())) => Ok(()),
        Ok(Err(RaftCallError::NotLeader)) => Err(ApiError::NoLeader("this node is not the leader".into())),
        Ok(Err(RaftCallError::HandingOver)) => Err(handing_over()),
        Ok(Err(e)) => Err(ApiError::Unavailable(e.to_string())),
        Err(_) => Err(ApiError::Unavailable(format!("no quorum within {}", humantime::format_duration(timeout)))),
    }
}

/// Whether this node, as leader of its current term, has applied a fresh
/// entry of the term and reset its lease clock (see `keeper`): until then
/// its table may still hold what the log has ended.
fn started(node: &Node) -> bool {
    let term = node.raft.metrics().borrow().current_term;
    node.clock_term.load(std::sync::atomic::Ordering::Acquire) == term
}

/// A backup of the table as applied after a quorum confirmed this node
/// leads: it holds every grant acknowledged before the request arrived.
async fn snapshot(node: &Node, caller: &Caller) -> Result<Response<Body>, ApiError> {
    linearizable(node).await?;
    let (locks, applied_index) = {
        let s = node.applied.lock();
        (s.locks.clone(), s.applied_index())
    };
    audit::snapshot(&caller.identity, locks.revision());
    let origin = backup::Origin {
        taken_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        node: node.id,
        term: node.raft.metrics().borrow().current_term,
        applied_index,
    };
    // Megabytes of JSON: encoded off the runtime threads, which the Raft
    // core needs for its heartbeats (see `raft::state_machine`'s snapshots).
    let file = tokio::task::spawn_blocking(move || backup::encode(&locks, origin))
        .await
        .map_err(|e| ApiError::Internal(format!("encoding the backup: {e}")))?;
    Ok(text(file, "application/x-fencegate-snapshot"))
}

async fn read(node: &Node, key: &str) -> Result<Response<Body>, ApiError> {
    linearizable(node).await?;
    let s = node.applied.lock();
    let token = s.locks.key(key).map(|k| k.token).unwrap_or(0);
    let holder = s.locks.holder_of(key);
    let below = s.locks.compacted_below();
    let info = LockInfo {
        compacted_below: (s.locks.key(key).is_none() && below > 0).then_some(below),
        key: key.to_string(),
        held: holder.is_some(),
        token,
        holder: holder.map(|(_, lease)| lease.holder.clone()),
        expires_in_ms: holder.and_then(|(id, _)| s.clock.remaining(id, Instant::now())).map(|d| d.as_millis() as u64),
        cluster: s.locks.cluster().map(str::to_string),
    };
    Ok(json(StatusCode::OK, &info))
}

/// The applied revision after a quorum confirmed this node is leader (in a
/// round that started after the request arrived): every event acknowledged
/// before the request was sent is at or below it.
async fn revision(node: &Node) -> Result<Response<Body>, ApiError> {
    linearizable(node).await?;
    let s = node.applied.lock();
    let (rev, cluster) = (s.locks.revision(), s.locks.cluster().map(str::to_string));
    Ok(json(StatusCode::OK, &wire::Revision { rev, cluster }))
}

/// L3: acknowledged only after a quorum confirmed this node is still leader,
/// and measured from when the request reached this node. No log write.
async fn keepalive(
    node: &Node,
    caller: &Caller,
    lease_id: &str,
    received: Instant,
) -> Result<Response<Body>, ApiError> {
    // Also waits for the lease clock's reset for this term (stale deadlines
    // and expiry marks from an earlier term must not answer).
    linearizable(node).await?;
    let mut guard = node.applied.lock();
    let s = &mut *guard;
    if let Some(lease) = s.locks.lease(lease_id) {
        may_use(node, caller, lease)?;
    }
    if !s.clock.keepalive(&s.locks, lease_id, received) {
        return Err(ApiError::LeaseNotFound);
    }
    let ttl_ms = s.locks.lease(lease_id).map(|l| l.ttl_ms).ok_or(ApiError::LeaseNotFound)?;
    Ok(json(StatusCode::OK, &KeepaliveAck { ttl_ms }))
}

async fn release(node: &Node, caller: &Caller, lease_id: &str) -> Result<Response<Body>, ApiError> {
    // A lease this leader has applied, and the caller may release, is
    // proposed at once: the committed entry decides (`NoSuchLease` if it
    // ended meanwhile), so no leadership round is needed first. Any other
    // id, and any id while a new leader is still starting (its table may
    // still hold leases the log has ended), is answered from the
    // linearizable state, so that guessing or replaying lease ids writes
    // nothing to the log.
    let applied_here =
        started(node) && node.applied.lock().locks.lease(lease_id).is_some_and(|l| permitted(node, caller, l));
    if !applied_here {
        linearizable(node).await?;
        if node.applied.lock().locks.lease(lease_id).map(|l| may_use(node, caller, l)).transpose()?.is_none() {
            return Err(ApiError::LeaseNotFound);
        }
    }
    let cmd = Command::Release { lease_id: lease_id.to_string(), by: caller.identity.clone() };
    match propose(node, cmd).await? {
        Outcome::Ended { key, token } => Ok(json(StatusCode::OK, &Released { key, token, released: true })),
        Outcome::NoSuchLease => Err(ApiError::LeaseNotFound),
        other => Err(ApiError::Internal(format!("release produced {other:?}"))),
    }
}

/// A lease may be kept alive or released by its owner (if it still has the
/// `acquire` right on the key), or by an admin of the key.
fn may_use(node: &Node, caller: &Caller, lease: &crate::lock::state::Lease) -> Result<(), ApiError> {
    if permitted(node, caller, lease) {
        return Ok(());
    }
    audit::denied(&caller.identity, Right::Acquire, &lease.key, "the lease is another identity's");
    Err(ApiError::Forbidden(format!("the lease on {} is not {}'s", lease.key, caller.identity)))
}

/// `may_use` without its refusal (nothing audited).
fn permitted(node: &Node, caller: &Caller, lease: &crate::lock::state::Lease) -> bool {
    let acl = node.acl.load();
    let own = lease.owner == caller.identity && acl.allows(&caller.identity, Right::Acquire, &lease.key);
    own || acl.allows(&caller.identity, Right::Admin, &lease.key)
}
