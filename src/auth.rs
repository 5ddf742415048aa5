//! Who a Lock API request comes from and what it may do: identities, bearer
//! tokens (stored as hashes) and the ACL. Pure: the token file's reloading
//! and the request handling are in `server::credentials`.
//!
//! Rights are granted per key prefix:
//! - `read`: `GET /v1/locks/{key}`;
//! - `watch`: the watch stream, which shows such an identity only the keys
//!   it may watch;
//! - `acquire`: take a key, and keep alive or release the leases it took;
//! - `admin`: all of these, and release (revoke) anyone's lease on the prefix.

use std::collections::HashMap;

use ring::digest::{digest, SHA256};
use serde::Deserialize;

/// The identity of every request when clients do not authenticate
/// (`fencegate dev`, loopback).
pub const ANONYMOUS: &str = "anonymous";

/// The longest identity (a certificate's name, a token's owner).
const MAX_IDENTITY: usize = crate::lock::validate::MAX_HOLDER_LEN;

/// The rule of holder names: 1–128 printable ASCII characters (spaces
/// allowed, as in a certificate's common name), which can be logged and
/// compared as they are.
pub fn identity_ok(name: &str) -> bool {
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

    /// Whether `identity` may open a watch of `prefix`: it may watch some key
    /// under it (the stream then shows it only those keys).
    pub fn may_watch(&self, identity: &str, prefix: &str) -> bool {
        let Some(rules) = &self.rules else { return true };
        rules.iter().any(|r| {
            r.matches(identity)
                && r.grants(Right::Watch)
                && r.prefixes.iter().any(|p| p.starts_with(prefix) || AclRule::covers(p, prefix))
        })
    }
}

/// The SHA-256 of a bearer token, as stored in a tokens file.
pub fn token_hash(token: &str) -> [u8; 32] {
    digest(&SHA256, token.as_bytes()).as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// The contents of a tokens file: `identity: sha256:<64 hex digits>` (or a
/// list of them, to rotate a token without a gap), one identity per line.
/// Only hashes are stored: the file reveals no token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    owners: HashMap<[u8; 32], String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl Tokens {
    pub fn parse(yaml: &str) -> Result<Tokens, String> {
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

    /// The identity `token` belongs to, if any.
    pub fn owner(&self, token: &str) -> Option<&str> {
        self.owners.get(&token_hash(token)).map(String::as_str)
    }

    /// How many tokens are known.
    pub fn count(&self) -> usize {
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
pub fn hash_line(token: &str) -> String {
    sha256_text(token.as_bytes())
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_text(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(digest(&SHA256, bytes)))
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
        assert!(acl.may_watch("s", ""), "the whole table, filtered to rack/");
        assert!(acl.may_watch("s", "rack/4"));
        assert!(!acl.may_watch("s", "fw/"));
        assert!(!acl.may_watch("r", "rack/"), "read is not watch");
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
        assert_eq!(tokens.owner("t-ci"), Some("ci"));
        assert_eq!(tokens.owner("t-ops-old"), Some("ops"));
        assert_eq!(tokens.owner("t-ops"), Some("ops"));
        assert_eq!(tokens.owner("t-c"), None);
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
}
