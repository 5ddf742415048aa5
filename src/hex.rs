//! Lower-case hex, pure: digests as the sidecar's records and the tokens
//! file spell them. Written out by hand because `format!("{b:02x}")` per
//! byte allocates a string per byte, on the idempotency path of every keyed
//! write.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hex, two digits per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_digits_per_byte_with_leading_zeros() {
        assert_eq!(lower(&[]), "");
        assert_eq!(lower(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        let all: Vec<u8> = (0..=255).collect();
        let slow: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(lower(&all), slow);
    }
}
