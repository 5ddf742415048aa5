//! Percent-decoding (RFC 3986), pure: the sidecar's path matching and the
//! Lock API's keys and watch parameters read escapes with the same code.

/// Percent-decode; invalid escapes are kept as they are (callers that must
/// refuse them check first, or check the result's alphabet).
pub(crate) fn decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex_byte(bytes.get(i + 1..i + 3))) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The `name=value` pairs of a URL query (empty pairs skipped), each value
/// percent-decoded once, as every HTTP client encodes them (`prefix=rack%2F`);
/// what they decode to is the caller's to check. `Err` names a pair that
/// is not `name=value`, or whose value is not UTF-8 once decoded.
pub(crate) fn query(query: Option<&str>) -> impl Iterator<Item = Result<(&str, String), String>> {
    query.unwrap_or("").split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("{pair:?} is not name=value"))?;
        let value = String::from_utf8(decode(value)).map_err(|_| format!("{pair:?} is not UTF-8 once decoded"))?;
        Ok((name, value))
    })
}

/// The byte two hex digits spell, if they are two hex digits.
pub fn hex_byte(pair: Option<&[u8]>) -> Option<u8> {
    let &[hi, lo] = pair? else { return None };
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    Some(digit(hi)? << 4 | digit(lo)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_decoded_once_and_bad_ones_kept() {
        assert_eq!(decode("rack%2F42"), b"rack/42");
        assert_eq!(decode("a%3Ab%3a"), b"a:b:");
        assert_eq!(decode("%252F"), b"%2F", "once, not twice");
        assert_eq!(decode("%zz%2"), b"%zz%2");
        assert_eq!(decode("%C3%A4"), "ä".as_bytes());
    }
}
