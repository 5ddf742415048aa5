//! Who a Lock API request comes from and what it may do: identities, bearer
//! tokens (stored as hashes) and the ACL; and how a member proves itself on
//! a plaintext peer plane (`PeerSecrets`). Pure: the files' reading and the
//! request handling are in `server::credentials`.
//!
//! Rights are granted per key prefix:
//! - `read`: `GET /v1/locks/{key}`;
//! - `watch`: the watch stream, which shows such an identity only the keys
//!   it may watch;
//! - `acquire`: take a key, and keep alive or release the leases it took;
//! - `admin`: all of these, and release (revoke) anyone's lease on the prefix.
//!
//! An ACL rule names an identity (or `prefix*` of identities), key prefixes
//! and rights, from the node config. `Tokens` holds the tokens file: identity
//! → SHA-256 hashes; a token is found by its hash, and the file holds none.
//! `PeerSecrets`: the HMAC proof a member sends, naming its own id, and its
//! constant-time check. Knows no HTTP, TLS or files.

use std::collections::HashMap;

use ring::digest::{digest, SHA256};
use ring::hmac;
use serde::Deserialize;

/// The identity of every request when clients do not authenticate
/// (`fencegate dev`, loopback).
pub(crate) const ANONYMOUS: &str = "anonymous";

/// The longest identity (a certificate's name, a token's owner).
const MAX_IDENTITY: usize = crate::lock::validate::MAX_HOLDER_LEN;

/// The rule of holder names: 1–128 printable ASCII characters (spaces
/// allowed, as in a certificate's common name), which can be logged and
/// compared as they are.
pub(crate) fn identity_ok(name: &str) -> bool {
    crate::lock::validate::holder(name).is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Right {
    Acquire,
    Read,
    Watch,
    Admin,
}

impl Right {
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Acquire => "acquire",
            Right::Read => "read",
            Right::Watch => "watch",
            Right::Admin => "admin",
        }
    }
}

/// One rule of the `acl` section: these identities have these rights on
/// every key under these prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// An identity, or a pattern ending in `*` (`ci-*`; `*` alone: anyone authenticated).
    pub identity: String,
    /// Key prefixes; `""` is every key.
    pub prefixes: Vec<String>,
    pub rights: Vec<Right>,
}

impl AclRule {
    pub fn validate(&self) -> Result<(), String> {
        let name = self.identity.strip_suffix('*').unwrap_or(&self.identity);
        if name.contains('*') || !(self.identity == "*" || identity_ok(name)) {
            return Err(format!(
                "identity {:?} must be a name of 1 to {MAX_IDENTITY} printable characters, optionally ending in *",
                self.identity
            ));
        }
        if self.prefixes.is_empty() || self.rights.is_empty() {
            return Err("a rule needs at least one prefix and one right".into());
        }
        for p in &self.prefixes {
            // A prefix ends at a segment boundary (`rack/`), or is a whole key.
            let key = p.strip_suffix('/').unwrap_or(p);
            if !p.is_empty() && crate::lock::validate::key(key).is_err() {
                let shown: String = p.chars().take(64).collect();
                return Err(format!(
                    "prefix {shown:?} must be \"\" (every key), a key prefix ending in / (rack/), or a whole key"
                ));
            }
        }
        Ok(())
    }

    /// `anonymous` is no identity a pattern stands for: only a rule naming
    /// it exactly gives it rights.
    fn matches(&self, identity: &str) -> bool {
        match self.identity.strip_suffix('*') {
            Some(start) => identity != ANONYMOUS && identity.starts_with(start),
            None => self.identity == identity,
        }
    }

    /// `rack/` covers `rack/42` but not `rackspace/1`; `rack/42` only itself.
    fn covers(prefix: &str, key: &str) -> bool {
        match prefix.is_empty() || prefix.ends_with('/') {
            true => key.starts_with(prefix),
            false => key == prefix,
        }
    }

    fn grants(&self, right: Right) -> bool {
        self.rights.iter().any(|r| *r == right || *r == Right::Admin)
    }
}

/// The rules, or no rules at all (every identity may do everything: only
/// when clients do not authenticate, which the node config allows on
/// loopback or when declared insecure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acl {
    rules: Option<Vec<AclRule>>,
}

impl Acl {
    /// Everything is allowed to everyone.
    pub fn open() -> Acl {
        Acl { rules: None }
    }

    /// Only what `rules` grant is allowed (none: nothing).
    pub fn rules(rules: Vec<AclRule>) -> Acl {
        Acl { rules: Some(rules) }
    }

    /// Whether `identity` has `right` on `key`.
    pub fn allows(&self, identity: &str, right: Right, key: &str) -> bool {
        let Some(rules) = &self.rules else { return true };
        rules
            .iter()
            .any(|r| r.matches(identity) && r.grants(right) && r.prefixes.iter().any(|p| AclRule::covers(p, key)))
    }

    /// Whether `identity` has `right` on some key under `prefix`: it may
    /// open a watch of it, or list it (and is then shown only those keys).
    pub fn reaches(&self, identity: &str, right: Right, prefix: &str) -> bool {
        !self.scans(identity, right, prefix).is_empty()
    }

    /// The prefixes to walk, in order, to find every key under `prefix` on
    /// which `identity` has `right`: none of them a prefix of another, so
    /// their keys come in key order, one prefix after the other. What lies
    /// outside them is never looked at. (A rule naming a whole key walks
    /// the keys that start with it: each key is still checked.)
    pub fn scans(&self, identity: &str, right: Right, prefix: &str) -> Vec<String> {
        let Some(rules) = &self.rules else { return vec![prefix.to_string()] };
        let mut walks: Vec<&str> = rules
            .iter()
            .filter(|r| r.matches(identity) && r.grants(right))
            .flat_map(|r| r.prefixes.iter())
            .filter_map(|p| match (p.starts_with(prefix), AclRule::covers(p, prefix)) {
                (true, _) => Some(p.as_str()),
                (false, true) => Some(prefix),
                (false, false) => None,
            })
            .collect();
        walks.sort_unstable();
        // Sorted, the prefixes a kept one covers come right after it.
        let mut kept: Vec<String> = Vec::with_capacity(walks.len());
        for p in walks {
            if !kept.last().is_some_and(|k| p.starts_with(k.as_str())) {
                kept.push(p.to_string());
            }
        }
        kept
    }
}

/// The SHA-256 of a bearer token, as stored in a tokens file.
pub(crate) fn token_hash(token: &str) -> [u8; 32] {
    digest(&SHA256, token.as_bytes()).as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// The contents of a tokens file: `identity: sha256:<64 hex digits>` (or a
/// list of them, to rotate a token without a gap), one identity per line.
/// Only hashes are stored: the file reveals no token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    owners: HashMap<[u8; 32], String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl Tokens {
    pub(crate) fn parse(yaml: &str) -> Result<Tokens, String> {
        let map: Option<HashMap<String, OneOrMany>> = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        let mut owners = HashMap::new();
        for (identity, hashes) in map.unwrap_or_default() {
            if !identity_ok(&identity) {
                return Err(format!("{identity:?} is not an identity (1 to {MAX_IDENTITY} printable characters)"));
            }
            let hashes = match hashes {
                OneOrMany::One(h) => vec![h],
                OneOrMany::Many(h) => h,
            };
            for h in hashes {
                // The value is not repeated: it may be a token pasted by mistake.
                let hash = parse_hash(&h).ok_or_else(|| {
                    format!("{identity}: a value is not sha256:<64 hex digits> (`fencegate token new` prints one)")
                })?;
                if let Some(other) = owners.insert(hash, identity.clone()) {
                    return Err(format!("one token hash is listed for both {other} and {identity}"));
                }
            }
        }
        Ok(Tokens { owners })
    }

    /// The identity the token of this hash belongs to, if any.
    pub(crate) fn owner_of_hash(&self, hash: &[u8; 32]) -> Option<&str> {
        self.owners.get(hash).map(String::as_str)
    }

    /// How many tokens are known.
    pub(crate) fn count(&self) -> usize {
        self.owners.len()
    }
}

fn parse_hash(s: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// `sha256:<hex>` of a token: the form a tokens file stores.
pub(crate) fn hash_line(token: &str) -> String {
    sha256_text(token.as_bytes())
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_text(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(digest(&SHA256, bytes)))
}

/// The shortest peer secret: 32 characters (`openssl rand -hex 32` gives 64).
pub(crate) const MIN_PEER_SECRET: usize = 32;

/// The contents of a `peer_secret_file`: the members' shared secret, one
/// per line. The first is the one this node proves; every line is accepted,
/// so that a new secret can be rolled out to every member (second line,
/// then first, then alone: a reload each) without a member refused on the
/// way.
///
/// A member proves it knows the secret, and which member it claims to be,
/// with `<id>.<hex HMAC-SHA256(secret, "fencegate peer v1 member <id>")>`
/// (an `Authorization: Bearer` value): the secret itself never crosses the
/// wire, and a proof names one member id. It is the same for every request:
/// whoever captures one (on a network: use `tls`) can replay it, and every
/// holder of the secret can compute every member's. Per-member identity
/// takes member certificates (`tls`).
pub struct PeerSecrets {
    keys: Vec<hmac::Key>,
}

impl PeerSecrets {
    pub fn parse(text: &str) -> Result<PeerSecrets, String> {
        let mut keys = vec![];
        for (i, line) in text.lines().map(str::trim).enumerate().filter(|(_, l)| !l.is_empty()) {
            // The value is not repeated: it is a secret.
            if line.len() < MIN_PEER_SECRET {
                return Err(format!(
                    "line {}: a secret must be at least {MIN_PEER_SECRET} characters (`openssl rand -hex 32`)",
                    i + 1
                ));
            }
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, line.as_bytes()));
        }
        if keys.is_empty() {
            return Err("holds no secret (`openssl rand -hex 32` makes one)".into());
        }
        Ok(PeerSecrets { keys })
    }

    /// What member `id` sends to prove itself, by the first secret.
    pub fn proof(&self, id: u64) -> String {
        format!("{id}.{}", hex::encode(hmac::sign(&self.keys[0], &proof_message(id))))
    }

    /// The member `proof` proves to be, if it is a proof by any of the
    /// secrets. The tags are compared in constant time (`hmac::verify`).
    pub fn member(&self, proof: &str) -> Option<u64> {
        let (id, tag) = proof.split_once('.')?;
        let id: u64 = id.parse().ok().filter(|n: &u64| n.to_string() == id)?;
        let tag = hex::decode(tag).ok()?;
        let message = proof_message(id);
        // Every secret is tried: which one matched takes no less time.
        let proven = self.keys.iter().fold(false, |ok, key| hmac::verify(key, &message, &tag).is_ok() | ok);
        proven.then_some(id)
    }
}

/// What a member's proof signs: its id, in a message of its own (a proof
/// is no valid MAC of anything else).
fn proof_message(id: u64) -> Vec<u8> {
    format!("fencegate peer v1 member {id}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_spelt_two_lower_case_digits_per_byte_as_ever() {
        // What tokens files and stored fingerprints hold was written as
        // `format!("{b:02x}")` per byte.
        assert_eq!(hex::encode([]), "");
        assert_eq!(hex::encode([0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        let all: Vec<u8> = (0..=255).collect();
        let slow: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex::encode(&all), slow);
    }

    fn rule(identity: &str, prefixes: &[&str], rights: &[Right]) -> AclRule {
        AclRule {
            identity: identity.into(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            rights: rights.to_vec(),
        }
    }

    #[test]
    fn rights_are_per_identity_and_prefix() {
        let acl = Acl::rules(vec![
            rule("deploy", &["rack/"], &[Right::Acquire]),
            rule("sidecar-*", &["rack/", "fw/"], &[Right::Read, Right::Watch]),
            rule("ops", &[""], &[Right::Admin]),
        ]);
        assert!(acl.allows("deploy", Right::Acquire, "rack/42"));
        assert!(!acl.allows("deploy", Right::Acquire, "fw/1"), "another prefix");
        assert!(!acl.allows("deploy", Right::Read, "rack/42"), "another right");
        assert!(!acl.allows("deploy2", Right::Acquire, "rack/42"), "an exact name is not a prefix");
        assert!(acl.allows("sidecar-a", Right::Watch, "fw/1"));
        assert!(!acl.allows("sidecar-a", Right::Acquire, "fw/1"));
        assert!(acl.allows("ops", Right::Acquire, "anything"), "admin implies every right");
        assert!(!acl.allows("nobody", Right::Read, "rack/42"));
        let exact =
            Acl::rules(vec![rule("e", &["rack/4", "fw/"], &[Right::Read]), rule("*", &["pub/"], &[Right::Read])]);
        assert!(exact.allows("e", Right::Read, "rack/4"));
        assert!(!exact.allows("e", Right::Read, "rack/42"), "a whole key is not a prefix of its neighbours");
        assert!(!exact.allows("e", Right::Read, "fwx/1"));
        assert!(exact.allows("anyone", Right::Read, "pub/1"));
        assert!(!exact.allows(ANONYMOUS, Right::Read, "pub/1"), "a pattern never stands for anonymous");
        assert!(!Acl::rules(vec![]).allows("ops", Right::Read, "x"), "no rules: nothing");
        assert!(Acl::open().allows("anyone", Right::Admin, "x"));
    }

    #[test]
    fn a_watch_may_open_where_some_key_under_it_may_be_watched() {
        let acl = Acl::rules(vec![rule("s", &["rack/"], &[Right::Watch]), rule("r", &["rack/"], &[Right::Read])]);
        assert!(acl.reaches("s", Right::Watch, ""), "the whole table, filtered to rack/");
        assert!(acl.reaches("s", Right::Watch, "rack/4"));
        assert!(!acl.reaches("s", Right::Watch, "fw/"));
        assert!(!acl.reaches("r", Right::Watch, "rack/"), "read is not watch");
    }

    /// A listing walks only where the identity may read: each rule's
    /// prefix under the one asked, or the one asked where a rule covers it;
    /// none inside another, in key order.
    #[test]
    fn a_listing_walks_only_where_the_identity_may_read() {
        let acl = Acl::rules(vec![
            rule("o", &["rack/", "fw/1", "rack/4/", "zone/"], &[Right::Read]),
            rule("o", &["secret/"], &[Right::Watch]),
            rule("other", &[""], &[Right::Read]),
        ]);
        let scans = |prefix: &str| acl.scans("o", Right::Read, prefix);
        assert_eq!(scans(""), ["fw/1", "rack/", "zone/"], "rack/4/ lies inside rack/");
        assert_eq!(scans("rack/4"), ["rack/4"], "under rack/, as asked");
        assert_eq!(scans("fw/"), ["fw/1"], "a whole key under the prefix");
        assert_eq!(scans("fw/1/"), Vec::<String>::new(), "a whole key covers nothing under it");
        assert!(scans("secret/").is_empty(), "watch is not read");
        assert_eq!(acl.scans("other", Right::Read, "x/"), ["x/"]);
        assert_eq!(Acl::open().scans("anyone", Right::Read, "p/"), ["p/"]);
    }

    #[test]
    fn rules_are_validated() {
        assert!(rule("ci-*", &["a/"], &[Right::Read]).validate().is_ok());
        assert!(rule("*", &[""], &[Right::Read]).validate().is_ok());
        assert!(rule("c*i", &["a/"], &[Right::Read]).validate().is_err());
        assert!(rule("", &["a/"], &[Right::Read]).validate().is_err());
        assert!(rule("x\ty", &["a/"], &[Right::Read]).validate().is_err());
        assert!(rule("ci", &[], &[Right::Read]).validate().is_err());
        assert!(rule("ci", &["a/"], &[]).validate().is_err());
        assert!(rule("ci", &["a/b", "a/", ""], &[Right::Read]).validate().is_ok());
        for bad in ["rack/*", "a//", "/a", "a b/", "é/"] {
            assert!(rule("ci", &[bad], &[Right::Read]).validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_are_found_by_their_hash_only() {
        let file = format!("ci: {}\nops: [{}, {}]\n", hash_line("t-ci"), hash_line("t-ops-old"), hash_line("t-ops"));
        let tokens = Tokens::parse(&file).unwrap();
        assert_eq!(tokens.owner_of_hash(&token_hash("t-ci")), Some("ci"));
        assert_eq!(tokens.owner_of_hash(&token_hash("t-ops-old")), Some("ops"));
        assert_eq!(tokens.owner_of_hash(&token_hash("t-ops")), Some("ops"));
        assert_eq!(tokens.owner_of_hash(&token_hash("t-c")), None);
        assert!(!file.contains("t-ci"), "the file holds no token");
        assert_eq!(Tokens::parse("").unwrap().count(), 0);
        for bad in [
            "ci: t-ci\n",
            "ci: sha256:abc\n",
            &format!("ci: {}\nops: {}\n", hash_line("same"), hash_line("same")),
            &format!("\"a\\tb\": {}\n", hash_line("x")),
            "- a list\n",
        ] {
            assert!(Tokens::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_peer_proof_names_one_member_and_holds_only_under_the_secret() {
        let secret = "a".repeat(MIN_PEER_SECRET);
        let other = "b".repeat(MIN_PEER_SECRET);
        let s = PeerSecrets::parse(&format!("{secret}\n")).unwrap();
        let proof = s.proof(2);
        assert!(proof.starts_with("2.") && !proof.contains(&secret), "{proof}");
        assert_eq!(s.member(&proof), Some(2));
        // Another id with this tag, the tag cut or changed, another secret's proof.
        let tag = proof.strip_prefix("2.").unwrap();
        let mut flipped = tag.to_string().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        let others = PeerSecrets::parse(&other).unwrap();
        for forged in [
            format!("3.{tag}"),
            format!("02.{tag}"),
            format!("2.{}", &tag[..62]),
            format!("2.{flipped}"),
            others.proof(2),
            secret.clone(),
            format!("2.{secret}"),
            String::new(),
            "2.".into(),
        ] {
            assert_eq!(s.member(&forged), None, "{forged}");
        }
        // Rotation: the first line is proved, every line accepted.
        let both = PeerSecrets::parse(&format!("{other}\n\n{secret}\n")).unwrap();
        assert_eq!(both.member(&s.proof(1)), Some(1));
        assert_eq!(both.member(&others.proof(1)), Some(1));
        assert_eq!(both.proof(1), others.proof(1));
        for bad in ["", "\n  \n", "short", &format!("{secret}\n{}", &other[1..])] {
            let e = PeerSecrets::parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert!(!e.contains(&secret[1..]), "the secret is not repeated: {e}");
        }
    }
}
