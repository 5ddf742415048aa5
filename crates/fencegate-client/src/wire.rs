//! The wire protocol, defined once: the bodies of the Lock API, the watch
//! stream's lines, `GET /v1/cluster`, the error codes, the fencing token and
//! the header that carries it, and the sidecar's own answers.
//!
//! The lock service serialises these types and the client and the sidecar
//! deserialise the same ones, so a renamed field fails to compile instead of
//! failing at run time. `docs/DESIGN.md` describes the same messages for
//! people; the tests at the bottom pin the JSON to it.

use hyper::StatusCode;
use serde::{Deserialize, Serialize};

/// A fencing token: strictly increasing over all grants of all keys (L1).
/// The lock service's first token is 1; 0 means "never granted".
pub type Token = u64;

/// The request header that carries a fencing token to the sidecar and the
/// resource (lower case, as HTTP/2 requires).
pub const TOKEN_HEADER: &str = "x-fence-token";

/// The header on every Lock API answer (and peer RPC) naming the cluster
/// whose history the answering node holds: 32 hex digits, made when the
/// cluster was founded and anew by every restore. Absent from a node that
/// has none yet, or of a build before cluster ids. Two answers with
/// different ids come from different histories: a token, revision or
/// position of one says nothing about the other.
pub const CLUSTER_HEADER: &str = "fencegate-cluster";

/// The path prefix of the Lock API's key calls: `POST|GET /v1/locks/{key}`.
pub const LOCKS_PATH: &str = "/v1/locks/";
/// `GET /v1/locks?prefix=P[&limit=N]`: the lock table under a prefix
/// ([`LockTable`]), the keys the caller may `read`.
pub const LOCK_TABLE_PATH: &str = "/v1/locks";
/// `POST /v1/leases/{lease_id}/keepalive`, `DELETE /v1/leases/{lease_id}`.
pub const LEASES_PATH: &str = "/v1/leases/";
/// `GET /v1/cluster`.
pub const CLUSTER_PATH: &str = "/v1/cluster";
/// `GET` lists the members, `POST` ([`AddMember`]) adds one,
/// `DELETE {MEMBERS_PATH}/{id}` (`?force=true`) removes one; each needs the
/// `admin` right on every key (a rule with prefix `""`).
pub const MEMBERS_PATH: &str = "/v1/members";
/// `GET`: the leader's backup of the lock table (a `fencegate snapshot`
/// file: a header line, then the table, checksummed); needs the `admin`
/// right on every key.
pub const SNAPSHOT_PATH: &str = "/v1/snapshot";
/// `GET /v1/watch?prefix=P[&after=REV]`.
pub const WATCH_PATH: &str = "/v1/watch";
/// `GET`: the table's revision, read linearizably ([`Revision`]); needs the
/// `watch` right on some key.
pub const REVISION_PATH: &str = "/v1/revision";
/// `GET`: the Lock API's OpenAPI 3 document (`docs/openapi.yaml`), served
/// without credentials.
pub const OPENAPI_PATH: &str = "/v1/openapi.yaml";

/// `POST /v1/locks/{key}`. Every field is optional; the node's `lease`
/// config supplies the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// The lease TTL in milliseconds; default `lease.default_ttl`, within
    /// `[min_ttl, max_ttl]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// How long the leader may queue the request while the key is held, in
    /// milliseconds; default 0, at most `lease.max_wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The holder's name: 1–128 printable ASCII characters; default `anonymous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Chosen by the client (1–64 of `[A-Za-z0-9_-]`); a retry with the same
    /// id gets the first grant back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// L6, per request: the lock-delay after this lease expires, in
    /// milliseconds; default `lease.lock_delay`, at most `lease.max_ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
}

/// 200 to an acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Granted {
    /// The key granted.
    pub key: String,
    /// The grant's fencing token.
    pub token: Token,
    /// Secret: proves ownership to the lock service; never sent to resources.
    /// 32 lower-case hex characters.
    pub lease_id: String,
    /// The lease's TTL in milliseconds.
    pub ttl_ms: u64,
}

/// 200 to a keepalive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepaliveAck {
    /// The lease's TTL in milliseconds, renewed from when the leader received
    /// the keepalive.
    pub ttl_ms: u64,
}

/// 200 to `GET /v1/revision`: the leader's applied revision after a quorum
/// confirmed its leadership, in a round that started after the request
/// arrived. Every grant, release and expiry acknowledged before the request
/// was sent has a revision at most `rev`. (A sidecar's proof that its watch
/// stream is current: once the stream has delivered everything up to `rev`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    /// The leader's applied revision once its leadership was confirmed.
    pub rev: u64,
    /// The leader's cluster id ([`CLUSTER_HEADER`]); absent from a leader
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// 200 to a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    /// The key of the released lease.
    pub key: String,
    /// The released lease's token.
    pub token: Token,
    /// Always `true`.
    pub released: bool,
}

/// 200 to `GET /v1/locks/{key}` (a linearizable read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The key read.
    pub key: String,
    /// Whether a live lease holds the key.
    pub held: bool,
    /// The latest grant of the key (0 if never granted, or forgotten), also when free.
    pub token: Token,
    /// The holder's name; `None` when the key is not held.
    pub holder: Option<String>,
    /// The leader's time left before it expires the lease, in milliseconds;
    /// `None` when the key is not held.
    pub expires_in_ms: Option<u64>,
    /// Set when the service has forgotten idle keys (compaction) and this
    /// key is not in its table: every token up to this value that this key
    /// may have had has ended. (A token above it was never this key's.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacted_below: Option<Token>,
    /// The leader's cluster id ([`CLUSTER_HEADER`]): the history this answer
    /// is of. Absent from a leader without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// 200 to `GET /v1/locks?prefix=P[&limit=N]`: the keys under `P` the
/// caller may `read`, in key order, as the leader holds them after a
/// quorum confirmed its leadership (what an operator's console lists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    /// The revision the table is at.
    pub rev: u64,
    /// The leader's cluster id ([`CLUSTER_HEADER`]); absent from a leader
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The first `limit` keys.
    pub locks: Vec<LockRow>,
    /// More keys the caller may read lie under the prefix: narrow it.
    pub truncated: bool,
}

/// One key of a [`LockTable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRow {
    /// The key.
    pub key: String,
    /// Whether a live lease holds it.
    pub held: bool,
    /// Its latest grant.
    pub token: Token,
    /// The holder's name; `None` when not held.
    pub holder: Option<String>,
    /// The identity that acquired the live lease; `None` when not held.
    pub owner: Option<String>,
    /// The leader's time left before it expires the lease, in
    /// milliseconds; `None` when not held.
    pub expires_in_ms: Option<u64>,
    /// The live lease's TTL, in milliseconds; `None` when not held.
    pub ttl_ms: Option<u64>,
    /// The live lease's lock-delay (L6), in milliseconds; `None` when not held.
    pub lock_delay_ms: Option<u64>,
    /// A lock-delay in force after an expiry: time left before the key can
    /// be granted again, in milliseconds; `None` when there is none.
    pub delay_left_ms: Option<u64>,
    /// Acquires waiting on the leader for this key.
    pub waiters: u64,
}

/// 200 to `GET /v1/cluster`: the cluster as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// The answering node's id.
    pub id: u64,
    /// The leader's id; `None` if no leader is known.
    pub leader: Option<u64>,
    /// The current Raft term.
    pub term: u64,
    /// openraft's server state: `Leader`, `Follower`, `Candidate`, `Learner`
    /// or `Shutdown`.
    pub state: String,
    /// The voters.
    pub members: Vec<Member>,
    /// The node's *applied* index (at most the commit index; 0 before any).
    pub commit_index: u64,
    /// The last index in the node's log (0 if empty).
    pub last_log_index: u64,
    /// The index of the latest snapshot, if any.
    pub snapshot_index: Option<u64>,
    /// The highest purged log index, if any.
    pub purged_index: Option<u64>,
    /// The rules the node's lock table is applied by (DESIGN, "Versions and
    /// upgrades"); 0 from a build before they were numbered.
    #[serde(default)]
    pub rules: u32,
    /// The cluster id of the history the node holds ([`CLUSTER_HEADER`]);
    /// `None` before it has one (a new cluster's first moments, a node not
    /// yet contacted by its leader) or from a build before cluster ids.
    #[serde(default)]
    pub cluster: Option<String>,
}

/// A voter, with its URL as the answering node's `peers` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The node id.
    pub id: u64,
    /// Its URL in the answering node's `peers`; `None` if it has none.
    pub url: Option<String>,
}

/// One line of the NDJSON watch stream. Every line carries `rev`; a watcher
/// that reconnects with `after=<rev>` of the last event or heartbeat it
/// processed gets exactly what it missed, or `resync` and the state again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchLine {
    /// The current state of one key, at the start of a stream or after `resync`.
    /// Not a resume point.
    State {
        /// The key.
        key: String,
        /// Whether a live lease holds it.
        held: bool,
        /// Its latest grant.
        token: Token,
        /// The holder's name; `None` when not held.
        holder: Option<String>,
        /// The revision this state is at.
        rev: u64,
    },
    /// A grant.
    Granted {
        /// The event's revision; equal to `token`.
        rev: u64,
        /// The key granted.
        key: String,
        /// The new lease's token.
        token: Token,
        /// The holder's name.
        holder: String,
        /// The lease's TTL in milliseconds.
        ttl_ms: u64,
    },
    /// The lease of `token` was released.
    Released {
        /// The event's revision.
        rev: u64,
        /// The key.
        key: String,
        /// The released lease's token.
        token: Token,
    },
    /// The lease of `token` expired.
    Expired {
        /// The event's revision.
        rev: u64,
        /// The key.
        key: String,
        /// The expired lease's token.
        token: Token,
    },
    /// Resumption was not possible; the state lines follow.
    Resync {
        /// The revision the state lines that follow are at.
        rev: u64,
    },
    /// Sent when the node has applied nothing for 5 s: the stream is complete
    /// up to `rev`.
    Heartbeat {
        /// The revision the stream is complete up to; a resume point.
        rev: u64,
    },
    /// A line type from a newer server; skipped.
    #[serde(other)]
    Unknown,
}

/// The `error` of every Lock API refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: an invalid key, body, field value or watch parameter.
    BadRequest,
    /// 413: a request body over 64 KiB.
    BodyTooLarge,
    /// 408: the request body did not arrive within the node's `limits.body_timeout`.
    RequestTimeout,
    /// 401: no credentials where the node requires them, or ones it does
    /// not know (an unknown token, a certificate naming nobody).
    Unauthorized,
    /// 403: the identity lacks the right on this key, or the lease is
    /// another identity's. Nothing changed.
    Forbidden,
    /// 429: a quota (the node's `limits.max_keys` or
    /// `limits.max_leases_per_identity`) is reached. Nothing changed.
    QuotaExceeded,
    /// 404: no such path.
    NotFound,
    /// 405: a known path with another method.
    MethodNotAllowed,
    /// 404: the lease was released, expired, never granted, or is expiring.
    LeaseNotFound,
    /// The key was not granted within `wait_ms`.
    Held,
    /// 409: a membership change refused: it would leave the new voters
    /// without a live majority (unless forced), another change is in
    /// progress, or the node is already a voter. Nothing changed.
    MembershipRefused,
    /// No leader known, or it moved mid-request. Retry (another node).
    NoLeader,
    /// No quorum in time. For a write, the outcome is unknown.
    Unavailable,
    /// 409: a watch resuming at a position this node cannot vouch for: a
    /// revision beyond its own (after waiting a moment for it to catch
    /// up), or of another cluster's history. The body carries the node's
    /// `rev` and `cluster`: a watcher of the same cluster resumes on
    /// another node; one of another cluster drops its position and starts
    /// over from the state (a restore happened).
    PositionUnknown,
    /// 409: the node belongs to another cluster than the one asking (a
    /// peer RPC, or a member to add whose data directory holds another
    /// history). Nothing changed.
    ForeignCluster,
    /// 500: a bug in the lock service.
    Internal,
    /// A code from a newer server.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The code as it appears in the body's `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::LeaseNotFound => "lease_not_found",
            ErrorCode::Held => "held",
            ErrorCode::MembershipRefused => "membership_refused",
            ErrorCode::NoLeader => "no_leader",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::PositionUnknown => "position_unknown",
            ErrorCode::ForeignCluster => "foreign_cluster",
            ErrorCode::Internal => "internal",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The HTTP status the lock service answers this code with.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::BadRequest | ErrorCode::Unknown => StatusCode::BAD_REQUEST,
            ErrorCode::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::NotFound | ErrorCode::LeaseNotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Held | ErrorCode::MembershipRefused | ErrorCode::PositionUnknown | ErrorCode::ForeignCluster => {
                StatusCode::CONFLICT
            }
            ErrorCode::NoLeader | ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The body of every Lock API refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong.
    pub error: ErrorCode,
    /// A human-readable explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Who holds the key, on `held`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldBy>,
    /// Where the node is, on `position_unknown`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub position: Option<NodePosition>,
}

/// The details of a `position_unknown` refusal: the answering node's
/// applied revision and cluster id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePosition {
    /// The node's applied revision.
    pub rev: u64,
    /// The node's cluster id; `None` before it has one.
    pub cluster: Option<String>,
}

/// The details of a `held` refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBy {
    /// The key asked for.
    pub key: String,
    /// `None` while the key is in lock-delay and nobody holds it.
    pub holder: Option<String>,
    /// The latest grant of the key.
    pub token: Token,
    /// The key is free but in lock-delay after an expiry (L6).
    pub lock_delay: bool,
}

/// Why the sidecar refused a request on a fenced route: the `error` of the
/// answer and the `reason` label of `fencegate_sidecar_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Below the key's latest grant or floor (S2). 409.
    StaleToken,
    /// The token's lease is known to have ended (S4, strict). 409.
    LeaseExpired,
    /// Never granted for this key (S3). 409.
    UnknownToken,
    /// No token on a fenced route. 428.
    MissingToken,
    /// Not exactly one plain decimal u64 (S6). 400.
    MalformedToken,
    /// The token cannot be verified now. 503 with `Retry-After`.
    LockServiceUnavailable,
    /// The lock service's latest token for the key is below the highest
    /// token this sidecar already forwarded for it: the service's history is
    /// not the one the sidecar fenced with (a restore from an old backup by
    /// a build that could re-grant tokens, a clock set back). Neither the
    /// old holder's token nor the new one is forwarded until the service's
    /// tokens pass the floor. 503 with `Retry-After`.
    LockServiceBehindFloor,
}

impl Reason {
    /// Every reason, in the order of the enum: what the sidecar's metrics
    /// start at 0 and its tests iterate.
    pub const ALL: [Reason; 7] = [
        Reason::StaleToken,
        Reason::LeaseExpired,
        Reason::UnknownToken,
        Reason::MissingToken,
        Reason::MalformedToken,
        Reason::LockServiceUnavailable,
        Reason::LockServiceBehindFloor,
    ];

    /// The snake_case name, as in the answer's `error` and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::StaleToken => "stale_token",
            Reason::LeaseExpired => "lease_expired",
            Reason::UnknownToken => "unknown_token",
            Reason::MissingToken => "missing_token",
            Reason::MalformedToken => "malformed_token",
            Reason::LockServiceUnavailable => "lock_service_unavailable",
            Reason::LockServiceBehindFloor => "lock_service_behind_floor",
        }
    }

    /// The HTTP status the sidecar answers this refusal with.
    pub fn status(self) -> StatusCode {
        match self {
            Reason::StaleToken | Reason::LeaseExpired | Reason::UnknownToken => StatusCode::CONFLICT,
            Reason::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            Reason::MalformedToken => StatusCode::BAD_REQUEST,
            Reason::LockServiceUnavailable | Reason::LockServiceBehindFloor => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The sidecar's body for a fence refusal. The upstream never saw the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Why the request was refused.
    pub error: Reason,
    /// The name of the route that matched.
    pub route: String,
    /// The lock key the route mapped the request to.
    pub key: String,
    /// The token presented (`None` if there was none or it was malformed).
    pub token: Option<Token>,
    /// What the sidecar knows as the key's current token, where it knows one.
    pub current: Option<Token>,
}

/// The sidecar's other answers of its own: the request or the upstream failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// 400: the path is not canonical.
    MalformedPath,
    /// 400: a fenced route maps the path to an invalid lock key.
    InvalidKey,
    /// 400: a method with lower-case letters.
    MalformedMethod,
    /// 400: framing two HTTP parsers could read differently.
    AmbiguousFraming,
    /// 400: a typed path parameter (`{rack:int}`) whose value has no
    /// canonical form.
    InvalidParam,
    /// 400: an unsafe method on a path a fenced route covers, which only an
    /// unfenced route would take.
    UnfencedWrite,
    /// 400: a request that asks the upstream to take it as another method
    /// or path (method-override or URL-rewrite headers, `_method`), or that
    /// tells a proxy to drop `X-Fence-Token` (`Connection`).
    DisguisedRequest,
    /// 404: no route matches.
    NoRoute,
    /// 413: the body is above `limits.max_body`.
    BodyTooLarge,
    /// 408: a request body did not arrive whole within `limits.body_timeout`
    /// (or a fenced write's body of unannounced length within the route's
    /// timeout).
    BodyTimeout,
    /// 504: the upstream did not answer within the route's timeout.
    UpstreamTimeout,
    /// 502: the upstream could not be reached, or the exchange broke.
    UpstreamError,
    /// 400: a request head the HTTP parser refused before any route was
    /// chosen (differing `Content-Length`s, an unknown `Transfer-Encoding`,
    /// obsolete line folding, a malformed header line).
    MalformedRequest,
    /// 431: the request head is over `limits.max_header_bytes`.
    HeadersTooLarge,
    /// 414: the request target is too long for the HTTP parser.
    UriTooLong,
    /// 400: the `Idempotency-Key` header is malformed, or sent twice.
    MalformedIdempotencyKey,
    /// 428: the route requires an `Idempotency-Key` and the request has none.
    MissingIdempotencyKey,
    /// 422: the key was used for another request (method, path, type, body).
    IdempotencyKeyReused,
    /// 409: the first request with this key is still in flight.
    IdempotencyInFlight,
    /// 409: the first request with this key may or may not have been
    /// applied; a retry is never forwarded by itself (an operator resolves it).
    OutcomeUnknown,
    /// 409: the first request with this key was answered, but its answer
    /// was too large to keep (the route's `max_response`).
    ResponseNotKept,
    /// 503: the idempotency store is full (`limits.idempotency_store`).
    IdempotencyStoreFull,
    /// 429: the records of the request's lock key hold its quota (the
    /// route's `idempotency.per_lock_key`).
    IdempotencyQuota,
    /// 500: the sidecar failed.
    Internal,
}

impl Problem {
    /// Every problem, in the order of the enum: what the sidecar's metrics
    /// start at 0 and its tests iterate.
    pub const ALL: [Problem; 24] = [
        Problem::MalformedPath,
        Problem::InvalidKey,
        Problem::MalformedMethod,
        Problem::AmbiguousFraming,
        Problem::InvalidParam,
        Problem::UnfencedWrite,
        Problem::DisguisedRequest,
        Problem::NoRoute,
        Problem::BodyTooLarge,
        Problem::BodyTimeout,
        Problem::UpstreamTimeout,
        Problem::UpstreamError,
        Problem::MalformedRequest,
        Problem::HeadersTooLarge,
        Problem::UriTooLong,
        Problem::MalformedIdempotencyKey,
        Problem::MissingIdempotencyKey,
        Problem::IdempotencyKeyReused,
        Problem::IdempotencyInFlight,
        Problem::OutcomeUnknown,
        Problem::ResponseNotKept,
        Problem::IdempotencyStoreFull,
        Problem::IdempotencyQuota,
        Problem::Internal,
    ];

    /// The snake_case name, as in the answer's `error` and the `reason`
    /// label of `fencegate_sidecar_rejections_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Problem::MalformedPath => "malformed_path",
            Problem::InvalidKey => "invalid_key",
            Problem::MalformedMethod => "malformed_method",
            Problem::AmbiguousFraming => "ambiguous_framing",
            Problem::InvalidParam => "invalid_param",
            Problem::UnfencedWrite => "unfenced_write",
            Problem::DisguisedRequest => "disguised_request",
            Problem::NoRoute => "no_route",
            Problem::BodyTooLarge => "body_too_large",
            Problem::BodyTimeout => "body_timeout",
            Problem::UpstreamTimeout => "upstream_timeout",
            Problem::UpstreamError => "upstream_error",
            Problem::MalformedRequest => "malformed_request",
            Problem::HeadersTooLarge => "headers_too_large",
            Problem::UriTooLong => "uri_too_long",
            Problem::MalformedIdempotencyKey => "malformed_idempotency_key",
            Problem::MissingIdempotencyKey => "missing_idempotency_key",
            Problem::IdempotencyKeyReused => "idempotency_key_reused",
            Problem::IdempotencyInFlight => "idempotency_in_flight",
            Problem::OutcomeUnknown => "outcome_unknown",
            Problem::ResponseNotKept => "response_not_kept",
            Problem::IdempotencyStoreFull => "idempotency_store_full",
            Problem::IdempotencyQuota => "idempotency_quota",
            Problem::Internal => "internal",
        }
    }

    /// The HTTP status the sidecar answers this problem with.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::MalformedPath
            | Problem::InvalidKey
            | Problem::MalformedMethod
            | Problem::AmbiguousFraming
            | Problem::InvalidParam
            | Problem::UnfencedWrite
            | Problem::DisguisedRequest
            | Problem::MalformedIdempotencyKey
            | Problem::MalformedRequest => StatusCode::BAD_REQUEST,
            Problem::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Problem::UriTooLong => StatusCode::URI_TOO_LONG,
            Problem::MissingIdempotencyKey => StatusCode::PRECONDITION_REQUIRED,
            Problem::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::IdempotencyInFlight | Problem::OutcomeUnknown | Problem::ResponseNotKept => StatusCode::CONFLICT,
            Problem::IdempotencyStoreFull => StatusCode::SERVICE_UNAVAILABLE,
            Problem::IdempotencyQuota => StatusCode::TOO_MANY_REQUESTS,
            Problem::NoRoute => StatusCode::NOT_FOUND,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Problem::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Problem::UpstreamError => StatusCode::BAD_GATEWAY,
            Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The body of a sidecar answer other than a fence refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemBody {
    /// What went wrong.
    pub error: Problem,
    /// The route's name (`"-"` if none was chosen yet); absent for `no_route`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// A human-readable explanation, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Any answer the sidecar gives itself, for clients that want to tell them
/// from the upstream's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SidecarAnswer {
    /// A fence refusal.
    Rejected(Rejection),
    /// Any other answer of the sidecar's own.
    Problem(ProblemBody),
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    use super::*;

    /// `value` serialises to exactly `expected` (the JSON docs/DESIGN.md
    /// shows) and parses back to itself.
    fn pinned<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T, expected: Value) {
        assert_eq!(serde_json::to_value(&value).unwrap(), expected, "{value:?}");
        assert_eq!(serde_json::from_value::<T>(expected).unwrap(), value);
    }

    #[test]
    fn lock_api_bodies() {
        pinned(AcquireRequest::default(), json!({}));
        pinned(
            AcquireRequest {
                ttl_ms: Some(30_000),
                wait_ms: Some(0),
                holder: Some("bastion-2".into()),
                request_id: Some("r1".into()),
                lock_delay_ms: Some(5),
            },
            json!({"ttl_ms": 30000, "wait_ms": 0, "holder": "bastion-2", "request_id": "r1", "lock_delay_ms": 5}),
        );
        assert!(serde_json::from_value::<AcquireRequest>(json!({"ttl": 1})).is_err(), "unknown fields are refused");
        let g = Granted { key: "rack/42".into(), token: 33, lease_id: "ab".into(), ttl_ms: 30_000 };
        pinned(g, json!({"key": "rack/42", "token": 33, "lease_id": "ab", "ttl_ms": 30000}));
        pinned(KeepaliveAck { ttl_ms: 10 }, json!({"ttl_ms": 10}));
        pinned(Revision { rev: 40, cluster: None }, json!({"rev": 40}));
        pinned(Revision { rev: 40, cluster: Some("c1".into()) }, json!({"rev": 40, "cluster": "c1"}));
        pinned(
            Released { key: "k".into(), token: 3, released: true },
            json!({"key": "k", "token": 3, "released": true}),
        );
        pinned(
            LockInfo {
                key: "k".into(),
                held: false,
                token: 0,
                holder: None,
                expires_in_ms: None,
                compacted_below: None,
                cluster: None,
            },
            json!({"key": "k", "held": false, "token": 0, "holder": null, "expires_in_ms": null}),
        );
        pinned(
            ClusterInfo {
                id: 2,
                leader: Some(1),
                term: 4,
                state: "Follower".into(),
                members: vec![Member { id: 1, url: Some("http://127.0.0.1:7401".into()) }],
                commit_index: 9,
                last_log_index: 9,
                snapshot_index: None,
                purged_index: Some(3),
                rules: 1,
                cluster: Some("c1".into()),
            },
            json!({"id": 2, "leader": 1, "term": 4, "state": "Follower",
                   "members": [{"id": 1, "url": "http://127.0.0.1:7401"}],
                   "commit_index": 9, "last_log_index": 9, "snapshot_index": null, "purged_index": 3,
                   "rules": 1, "cluster": "c1"}),
        );
    }

    #[test]
    fn lock_api_errors() {
        pinned(
            ApiError { error: ErrorCode::LeaseNotFound, message: Some("gone".into()), held: None, position: None },
            json!({"error": "lease_not_found", "message": "gone"}),
        );
        let position = NodePosition { rev: 3, cluster: Some("c1".into()) };
        pinned(
            ApiError {
                error: ErrorCode::PositionUnknown,
                message: Some("m".into()),
                held: None,
                position: Some(position),
            },
            json!({"error": "position_unknown", "message": "m", "rev": 3, "cluster": "c1"}),
        );
        let held = HeldBy { key: "k".into(), holder: None, token: 7, lock_delay: true };
        pinned(
            ApiError { error: ErrorCode::Held, message: None, held: Some(held), position: None },
            json!({"error": "held", "key": "k", "holder": null, "token": 7, "lock_delay": true}),
        );
        for code in [
            ErrorCode::BadRequest,
            ErrorCode::BodyTooLarge,
            ErrorCode::RequestTimeout,
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::QuotaExceeded,
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::LeaseNotFound,
            ErrorCode::Held,
            ErrorCode::NoLeader,
            ErrorCode::Unavailable,
            ErrorCode::PositionUnknown,
            ErrorCode::ForeignCluster,
            ErrorCode::Internal,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), json!(code.as_str()));
        }
        let newer: ApiError = serde_json::from_value(json!({"error": "quota", "message": "m"})).unwrap();
        assert_eq!(newer.error, ErrorCode::Unknown);
        for (code, status) in [
            (ErrorCode::Held, 409),
            (ErrorCode::LeaseNotFound, 404),
            (ErrorCode::NoLeader, 503),
            (ErrorCode::Unavailable, 503),
            (ErrorCode::BodyTooLarge, 413),
        ] {
            assert_eq!(code.status().as_u16(), status, "{code:?}");
        }
    }

    #[test]
    fn watch_lines() {
        pinned(
            WatchLine::State { key: "k".into(), held: true, token: 3, holder: Some("a".into()), rev: 5 },
            json!({"event": "state", "key": "k", "held": true, "token": 3, "holder": "a", "rev": 5}),
        );
        pinned(
            WatchLine::Granted { rev: 3, key: "k".into(), token: 3, holder: "a".into(), ttl_ms: 100 },
            json!({"event": "granted", "rev": 3, "key": "k", "token": 3, "holder": "a", "ttl_ms": 100}),
        );
        pinned(
            WatchLine::Released { rev: 4, key: "k".into(), token: 3 },
            json!({"event": "released", "rev": 4, "key": "k", "token": 3}),
        );
        pinned(
            WatchLine::Expired { rev: 4, key: "k".into(), token: 3 },
            json!({"event": "expired", "rev": 4, "key": "k", "token": 3}),
        );
        pinned(WatchLine::Resync { rev: 9 }, json!({"event": "resync", "rev": 9}));
        pinned(WatchLine::Heartbeat { rev: 9 }, json!({"event": "heartbeat", "rev": 9}));
        let newer: WatchLine = serde_json::from_value(json!({"event": "compacted", "rev": 1})).unwrap();
        assert_eq!(newer, WatchLine::Unknown);
    }

    #[test]
    fn sidecar_answers() {
        let r = Rejection {
            error: Reason::StaleToken,
            route: "racks".into(),
            key: "rack/1".into(),
            token: Some(3),
            current: Some(4),
        };
        pinned(
            SidecarAnswer::Rejected(r),
            json!({"error": "stale_token", "route": "racks", "key": "rack/1", "token": 3, "current": 4}),
        );
        let r = Rejection {
            error: Reason::MissingToken,
            route: "racks".into(),
            key: "rack/1".into(),
            token: None,
            current: None,
        };
        pinned(
            SidecarAnswer::Rejected(r),
            json!({"error": "missing_token", "route": "racks", "key": "rack/1", "token": null, "current": null}),
        );
        pinned(
            SidecarAnswer::Problem(ProblemBody { error: Problem::NoRoute, route: None, message: Some("m".into()) }),
            json!({"error": "no_route", "message": "m"}),
        );
        pinned(
            SidecarAnswer::Problem(ProblemBody {
                error: Problem::UpstreamTimeout,
                route: Some("r".into()),
                message: None,
            }),
            json!({"error": "upstream_timeout", "route": "r"}),
        );
        // The names metrics and answers use are the JSON ones, each once.
        let mut names = std::collections::BTreeSet::new();
        for reason in Reason::ALL {
            assert_eq!(serde_json::to_value(reason).unwrap(), json!(reason.as_str()));
            assert!(names.insert(reason.as_str()), "{reason:?} twice");
        }
        for problem in Problem::ALL {
            assert_eq!(serde_json::to_value(problem).unwrap(), json!(problem.as_str()));
            assert!(names.insert(problem.as_str()), "{problem:?} twice");
        }
    }
}

/// The members, as the leader sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberList {
    /// The leader that answered.
    pub leader: u64,
    /// The last index in its log.
    pub last_log_index: u64,
    /// Whether a change is half done (a joint configuration).
    pub changing: bool,
    /// Voters first, then learners, each by id.
    pub members: Vec<MemberState>,
}

/// One member, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberState {
    /// Its node id.
    pub id: u64,
    /// `voter` or `learner`.
    pub role: String,
    /// Its peer plane, as its membership entry (or the leader's `peers`
    /// config) gives it.
    pub peer_url: String,
    /// Its Lock API, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_url: Option<String>,
    /// The last log index the leader knows it holds (the leader: its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_index: Option<u64>,
    /// Whether it answered the leader just now.
    pub reachable: bool,
}

/// `POST /v1/members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddMember {
    /// The new member's node id (its config's `id`; not 0).
    pub id: u64,
    /// Its `peer_listen` URL.
    pub peer_url: String,
    /// Its `listen` URL, told to clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_url: Option<String>,
    /// Add it even if the new voters would have no live majority.
    #[serde(default)]
    pub force: bool,
}
