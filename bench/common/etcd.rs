//! The 3-member etcd cluster of the benches (`fencegate_testkit::etcd`),
//! with its data on the project's disk, not tmpfs, so that fsync costs what
//! it costs. Spoken to through etcd's JSON gateway (`/v3/...`).

pub use fencegate_testkit::etcd::Etcd;

/// Start the three members; returns at once (wait for a leader before use).
pub fn start_etcd() -> Etcd {
    Etcd::start(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")))
}

/// Standard base64 with padding, as the JSON gateway wants keys and values.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}
