//! SHA-256 helpers: hex digests, fingerprints of canonical JSON, URL hashes.

use sha2::{Digest, Sha256};

use super::canonical::{CanonicalError, canonicalize};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let hex = hex_digest(Sha256::digest(bytes).into());
    String::from_utf8_lossy(&hex).into_owned()
}

/// A SHA-256 digest as 64 lower-case hex digits (ASCII), without allocating.
pub(crate) fn hex_digest(digest: [u8; 32]) -> [u8; 64] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0; 64];
    // Exact chunks of two, and nibbles below 16 (HEX's length): no index can fail.
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    hex
}

/// `sha256_hex(canonicalize(value))`: what counts as a change of an item.
pub fn fingerprint<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    Ok(sha256_hex(canonicalize(value)?.as_bytes()))
}

/// The first 32 hex characters of the SHA-256 of `url` (keys HTTP validators per URL).
pub fn hash_url(url: &str) -> String {
    let mut hex = sha256_hex(url.as_bytes());
    hex.truncate(32);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected digests computed independently with `printf '%s' TEXT | sha256sum`.

    #[test]
    fn sha256_hex_is_lower_case_hex() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn hash_url_is_the_first_32_hex_characters() {
        let url = "https://api.example.com/orders?page=2";
        assert_eq!(hash_url(url), "efbc823b631ae85df7eb74585c1e0641");
        assert!(sha256_hex(url.as_bytes()).starts_with(&hash_url(url)));
    }

    #[test]
    fn fingerprint_hashes_the_canonical_text() {
        let value = serde_json::json!({ "b": [1, 0.5, null], "a": "x" });
        assert_eq!(
            fingerprint(&value).unwrap(),
            "ff25fa36b45e6cda07c9aaa80724f7357e278b4c1ed191cb14a4876b4afbbda8"
        );
        let text =
            crate::json::Json::parse(r#"{ "b": [1.0, 5e-1, null], "a": "\u0078" }"#).unwrap();
        assert_eq!(fingerprint(&text), fingerprint(&value));
        assert!(fingerprint(&f64::NAN).is_err());
    }
}
