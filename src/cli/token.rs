//! `fencegate token new IDENTITY`: a fresh bearer token, and the line that
//! lets the nodes recognise it without storing it.

use crate::auth::{hash_line, identity_ok};

pub(super) fn new(identity: &str) -> anyhow::Result<i32> {
    if !identity_ok(identity) {
        anyhow::bail!("{identity:?} is not an identity: 1 to 128 printable ASCII characters");
    }
    // 256 bits from the OS-seeded CSPRNG: a hash of it cannot be reversed.
    let token = format!("fg_{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
    eprintln!("# The token: give it to the client (FENCEGATE_TOKEN, or a sidecar's lock_service.token_file).");
    println!("{token}");
    eprintln!("# The line for every node's auth.tokens_file (re-read within a second of a change):");
    println!("{identity:?}: {}", hash_line(&token));
    Ok(0)
}
