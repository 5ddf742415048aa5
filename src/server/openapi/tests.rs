//! The document against the wire types, so neither can change alone: each
//! schema has exactly the fields its type serialises (required = always
//! present, nullable = serialised as `null`, the JSON type of each), the
//! error codes are the wire's and each is documented under its own status,
//! and every route of the wire is described.

use std::collections::BTreeSet;

use fencegate_client::wire::{self, *};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::DOCUMENT;

fn document() -> Value {
    serde_yaml_ng::from_str(DOCUMENT).expect("docs/openapi.yaml parses")
}

/// Follow a local `$ref`.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let target = doc.pointer(r.strip_prefix('#').expect("local refs only"));
            resolve(doc, target.unwrap_or_else(|| panic!("dangling {r}")))
        }
        None => v,
    }
}

fn object<T: Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value).unwrap() {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

/// The JSON type a schema names for a value, as JSON Schema spells it.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Schema `name` describes the type whose fewest fields serialise to `min`
/// (every `Option` `None`) and whose most to `max` (every `Option` `Some`).
fn same_shape(doc: &Value, name: &str, min: Map<String, Value>, max: Map<String, Value>) {
    shape(doc, name, min, max, &BTreeSet::new());
}

/// `same_shape` for a body the node reads: an optional field the type also
/// takes as `null` (meaning absent) must be documented nullable, and one it
/// refuses as `null` must not be.
fn request_shape<T: DeserializeOwned + PartialEq + std::fmt::Debug>(
    doc: &Value,
    name: &str,
    min: Map<String, Value>,
    max: Map<String, Value>,
) {
    let absent: T = serde_json::from_value(Value::Object(min.clone())).unwrap();
    let takes_null = |field: &&String| {
        let mut with_null = min.clone();
        with_null.insert(field.to_string(), Value::Null);
        serde_json::from_value::<T>(Value::Object(with_null)).is_ok_and(|t| t == absent)
    };
    let nullable: BTreeSet<String> = max.keys().filter(|f| !min.contains_key(*f)).filter(takes_null).cloned().collect();
    shape(doc, name, min, max, &nullable);
}

fn shape(doc: &Value, name: &str, min: Map<String, Value>, max: Map<String, Value>, nulls: &BTreeSet<String>) {
    let schema = &doc["components"]["schemas"][name];
    let props = schema["properties"].as_object().unwrap_or_else(|| panic!("{name} has no properties"));
    let documented: BTreeSet<&str> = props.keys().map(String::as_str).collect();
    let serialised: BTreeSet<&str> = max.keys().map(String::as_str).collect();
    assert_eq!(documented, serialised, "{name}: the document's properties vs the wire type's fields");
    let required: BTreeSet<&str> =
        schema["required"].as_array().into_iter().flatten().map(|r| r.as_str().unwrap()).collect();
    let always: BTreeSet<&str> = min.keys().map(String::as_str).collect();
    assert_eq!(required, always, "{name}: required vs the fields always serialised");
    for (field, value) in &max {
        let p = resolve(doc, &props[field]);
        let nullable = p["nullable"].as_bool().unwrap_or(false);
        let null = min.get(field) == Some(&Value::Null) || nulls.contains(field);
        assert_eq!(nullable, null, "{name}.{field}: nullable");
        assert_eq!(p["type"].as_str(), Some(json_type(value)), "{name}.{field}: type");
        for v in [Some(value), min.get(field).filter(|v| !v.is_null())].into_iter().flatten() {
            if let Some(allowed) = p["enum"].as_array() {
                assert!(allowed.contains(v), "{name}.{field}: {v} is not in {allowed:?}");
            }
        }
    }
}

/// `same_shape` for a type without optional fields.
fn fixed_shape(doc: &Value, name: &str, value: Map<String, Value>) {
    same_shape(doc, name, value.clone(), value);
}

#[test]
fn every_schema_has_the_fields_of_its_wire_type() {
    let doc = document();
    let d = &doc;
    let some = AcquireRequest {
        ttl_ms: Some(30_000),
        wait_ms: Some(0),
        holder: Some("h".into()),
        request_id: Some("r".into()),
        lock_delay_ms: Some(0),
    };
    request_shape::<AcquireRequest>(d, "AcquireRequest", object(&AcquireRequest::default()), object(&some));
    let lease_id = "0123456789abcdef0123456789abcdef".to_string();
    fixed_shape(d, "Granted", object(&Granted { key: "k".into(), token: 1, lease_id, ttl_ms: 1 }));
    fixed_shape(d, "KeepaliveAck", object(&KeepaliveAck { ttl_ms: 1 }));
    let rev = Revision { rev: 1, cluster: None };
    same_shape(d, "Revision", object(&rev), object(&Revision { cluster: Some("c".into()), ..rev.clone() }));
    fixed_shape(d, "Released", object(&Released { key: "k".into(), token: 1, released: true }));
    let free = LockInfo {
        key: "k".into(),
        held: false,
        token: 0,
        holder: None,
        expires_in_ms: None,
        compacted_below: None,
        cluster: None,
    };
    let held = LockInfo {
        holder: Some("h".into()),
        expires_in_ms: Some(1),
        compacted_below: Some(1),
        cluster: Some("c".into()),
        ..free.clone()
    };
    same_shape(d, "LockInfo", object(&free), object(&held));
    let row = LockRow {
        key: "k".into(),
        held: false,
        token: 0,
        holder: None,
        owner: None,
        expires_in_ms: None,
        ttl_ms: None,
        lock_delay_ms: None,
        delay_left_ms: None,
        waiters: 0,
    };
    let held_row = LockRow {
        holder: Some("h".into()),
        owner: Some("o".into()),
        expires_in_ms: Some(1),
        ttl_ms: Some(1),
        lock_delay_ms: Some(1),
        delay_left_ms: Some(1),
        ..row.clone()
    };
    same_shape(d, "LockRow", object(&row), object(&held_row));
    let table = LockTable { rev: 1, cluster: None, locks: vec![], truncated: false };
    same_shape(d, "LockTable", object(&table), object(&LockTable { cluster: Some("c".into()), ..table.clone() }));
    let member = Member { id: 1, url: Some("http://127.0.0.1:7401".into()) };
    same_shape(d, "Member", object(&Member { url: None, ..member.clone() }), object(&member));
    let cluster = ClusterInfo {
        id: 1,
        leader: None,
        term: 1,
        state: "Follower".into(),
        members: vec![member],
        commit_index: 1,
        last_log_index: 1,
        snapshot_index: None,
        purged_index: None,
        rules: 1,
        cluster: None,
    };
    let full = ClusterInfo {
        leader: Some(1),
        snapshot_index: Some(1),
        purged_index: Some(1),
        cluster: Some("c".into()),
        ..cluster.clone()
    };
    same_shape(d, "ClusterInfo", object(&cluster), object(&full));
    let state = MemberState {
        id: 1,
        role: "voter".into(),
        peer_url: "http://127.0.0.1:7501".into(),
        client_url: None,
        matched_index: None,
        reachable: true,
    };
    let known =
        MemberState { client_url: Some("http://127.0.0.1:7401".into()), matched_index: Some(1), ..state.clone() };
    same_shape(d, "MemberState", object(&state), object(&known));
    let list = MemberList { leader: 1, last_log_index: 1, changing: false, members: vec![known] };
    fixed_shape(d, "MemberList", object(&list));
    let add = AddMember { id: 4, peer_url: "http://127.0.0.1:7504".into(), client_url: None, force: false };
    let add_all = AddMember { client_url: Some("http://127.0.0.1:7404".into()), force: true, ..add.clone() };
    // `force` is always serialised but may be left out (`#[serde(default)]`).
    let mut add_min = object(&add);
    add_min.remove("force");
    request_shape::<AddMember>(d, "AddMember", add_min, object(&add_all));
    assert_eq!(
        serde_json::from_value::<AddMember>(json!({"id": 4, "peer_url": "http://127.0.0.1:7504"})).unwrap(),
        add
    );

    let problem = wire::ApiError { error: ErrorCode::Internal, message: None, held: None, position: None };
    same_shape(d, "Problem", object(&problem), object(&wire::ApiError { message: Some("m".into()), ..problem }));
    let by = HeldBy { key: "k".into(), holder: None, token: 1, lock_delay: true };
    let held_by = |holder| wire::ApiError {
        error: ErrorCode::Held,
        message: None,
        held: Some(HeldBy { holder, ..by.clone() }),
        position: None,
    };
    same_shape(d, "Held", object(&held_by(None)), object(&held_by(Some("h".into()))));
    let position = |cluster, message| wire::ApiError {
        error: ErrorCode::PositionUnknown,
        message,
        held: None,
        position: Some(NodePosition { rev: 1, cluster }),
    };
    same_shape(
        d,
        "PositionUnknown",
        object(&position(None, None)),
        object(&position(Some("c".into()), Some("m".into()))),
    );
}

#[test]
fn every_watch_line_has_its_schema() {
    let doc = document();
    let d = &doc;
    let state = |holder| WatchLine::State { key: "k".into(), held: false, token: 1, holder, rev: 1 };
    same_shape(d, "WatchState", object(&state(None)), object(&state(Some("h".into()))));
    let granted = WatchLine::Granted { rev: 1, key: "k".into(), token: 1, holder: "h".into(), ttl_ms: 1 };
    fixed_shape(d, "WatchGranted", object(&granted));
    fixed_shape(d, "WatchReleased", object(&WatchLine::Released { rev: 1, key: "k".into(), token: 1 }));
    fixed_shape(d, "WatchExpired", object(&WatchLine::Expired { rev: 1, key: "k".into(), token: 1 }));
    fixed_shape(d, "WatchResync", object(&WatchLine::Resync { rev: 1 }));
    fixed_shape(d, "WatchHeartbeat", object(&WatchLine::Heartbeat { rev: 1 }));
    // The discriminator names each line's `event`, and no other.
    let mapping = doc["components"]["schemas"]["WatchLine"]["discriminator"]["mapping"].as_object().unwrap();
    let events: BTreeSet<&str> = mapping.keys().map(String::as_str).collect();
    assert_eq!(events, BTreeSet::from(["state", "granted", "released", "expired", "resync", "heartbeat"]));
    for (event, schema) in mapping {
        let name = schema.as_str().unwrap().rsplit('/').next().unwrap();
        assert_eq!(doc["components"]["schemas"][name]["properties"]["event"]["enum"], json!([event]), "{name}");
    }
}

/// Every code the wire defines (`Unknown` is the client's name for a code
/// from a newer server, never sent). The match has no wildcard, so a new
/// code does not compile until it is placed here.
fn wire_codes() -> Vec<ErrorCode> {
    use ErrorCode::*;
    let next = |c: Option<ErrorCode>| match c {
        None => Some(BadRequest),
        Some(BadRequest) => Some(BodyTooLarge),
        Some(BodyTooLarge) => Some(RequestTimeout),
        Some(RequestTimeout) => Some(Unauthorized),
        Some(Unauthorized) => Some(Forbidden),
        Some(Forbidden) => Some(QuotaExceeded),
        Some(QuotaExceeded) => Some(NotFound),
        Some(NotFound) => Some(MethodNotAllowed),
        Some(MethodNotAllowed) => Some(LeaseNotFound),
        Some(LeaseNotFound) => Some(Held),
        Some(Held) => Some(MembershipRefused),
        Some(MembershipRefused) => Some(NoLeader),
        Some(NoLeader) => Some(Unavailable),
        Some(Unavailable) => Some(PositionUnknown),
        Some(PositionUnknown) => Some(ForeignCluster),
        Some(ForeignCluster) => Some(Internal),
        Some(Internal) | Some(Unknown) => None,
    };
    std::iter::successors(next(None), |c| next(Some(*c))).collect()
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array().into_iter().flatten().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// The codes a response's body may carry: `Held`'s, or those its `allOf`
/// narrows `Problem`'s `error` to.
fn codes_of(doc: &Value, response: &Value) -> BTreeSet<String> {
    let schema = resolve(doc, &resolve(doc, response)["content"]["application/json"]["schema"]);
    match schema["allOf"].as_array() {
        Some(parts) => {
            assert_eq!(parts[0]["$ref"], "#/components/schemas/Problem");
            strings(&parts[1]["properties"]["error"]["enum"])
        }
        None => strings(&schema["properties"]["error"]["enum"]),
    }
}

#[test]
fn every_error_code_is_documented_under_its_status() {
    let doc = document();
    let wire: BTreeSet<String> = wire_codes().iter().map(|c| c.as_str().to_string()).collect();
    assert_eq!(strings(&doc["components"]["schemas"]["ErrorCode"]["enum"]), wire, "the ErrorCode enum");
    for code in &wire {
        let parsed: ErrorCode = serde_json::from_value(json!(code)).unwrap();
        assert_eq!(parsed.as_str(), code, "{code} is a wire code, not Unknown");
    }
    // The codes of the shared responses, and of each operation's answers,
    // each under the status the wire gives it.
    let mut documented = BTreeSet::new();
    for (name, response) in doc["components"]["responses"].as_object().unwrap() {
        let codes = codes_of(&doc, response);
        assert!(!codes.is_empty(), "response {name} names no code");
        documented.extend(codes);
    }
    let mut answered = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap().iter().filter(|(k, _)| *k != "parameters") {
            for (status, response) in op["responses"].as_object().unwrap() {
                let status: u16 = status.parse().unwrap();
                if status < 400 {
                    continue;
                }
                let codes = codes_of(&doc, response);
                assert!(!codes.is_empty(), "{method} {path} {status} documents no body");
                for code in codes {
                    let c: ErrorCode = serde_json::from_value(json!(code)).unwrap();
                    assert_eq!(c.status().as_u16(), status, "{method} {path}: {code} is documented under {status}");
                    answered.insert(code);
                }
            }
        }
    }
    documented.extend(answered.iter().cloned());
    assert_eq!(documented, wire, "the codes the responses carry");
    // 405 is answered on any path for a method it does not take (no
    // operation to list it under); not_found for paths the document lacks.
    let unlisted: BTreeSet<String> = wire.difference(&answered).cloned().collect();
    assert_eq!(unlisted, BTreeSet::from(["method_not_allowed".to_string()]), "codes no operation answers");
}

#[test]
fn every_route_is_documented_and_the_peer_plane_is_not() {
    let doc = document();
    let paths: BTreeSet<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
    let locks = format!("{}{{key}}", wire::LOCKS_PATH);
    let lease = format!("{}{{lease_id}}", wire::LEASES_PATH);
    let keepalive = format!("{lease}/keepalive");
    let member = format!("{}/{{id}}", wire::MEMBERS_PATH);
    let routes = [
        wire::LOCK_TABLE_PATH,
        locks.as_str(),
        &lease,
        &keepalive,
        wire::WATCH_PATH,
        wire::CLUSTER_PATH,
        wire::MEMBERS_PATH,
        &member,
        wire::SNAPSHOT_PATH,
        wire::REVISION_PATH,
        wire::OPENAPI_PATH,
        "/healthz",
        "/readyz",
        "/metrics",
    ];
    assert_eq!(paths, BTreeSet::from(routes));
    // The document's own example of a request is one the node would parse.
    let example = &doc["components"]["schemas"]["AcquireRequest"]["example"];
    serde_json::from_value::<AcquireRequest>(example.clone()).expect("the AcquireRequest example");
}
