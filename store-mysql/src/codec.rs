//! Rows in and out: JSON text as bytes, exactly as given, and stored bytes back into watukuy's
//! types (a row that does not decode is a `Corrupt` store error naming it, never a panic).

use serde::de::DeserializeOwned;
use watukuy_core::{
    Error, Result,
    json::Json,
    store::{ParkedKind, StoreErrorKind},
};

/// `what` as UTF-8 text.
pub(crate) fn text(what: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| Error::corrupt(format!("{what} (not UTF-8)"), e))
}

/// An optional `what` as UTF-8 text.
pub(crate) fn opt_text(what: &str, bytes: Option<Vec<u8>>) -> Result<Option<String>> {
    bytes.map(|b| text(what, b)).transpose()
}

/// `what` stored as JSON text, decoded.
pub(crate) fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::corrupt(what, e))
}

/// An optional `what` stored as JSON text, decoded.
pub(crate) fn opt_decode<T: DeserializeOwned>(
    what: &str,
    bytes: Option<Vec<u8>>,
) -> Result<Option<T>> {
    bytes.map(|b| decode(what, &b)).transpose()
}

/// JSON text stored byte for byte, read back as [`Json`] (checked to be one JSON value).
pub(crate) fn raw_json(what: &str, bytes: Option<Vec<u8>>) -> Result<Option<Json>> {
    bytes
        .map(|b| {
            let text = text(what, b)?;
            Json::parse(&text).map_err(|e| Error::corrupt(what, e))
        })
        .transpose()
}

/// Serializes a value the store writes as JSON text.
pub(crate) use watukuy_core::json::encode_for_store as encode;

/// A parked row's kind as stored.
pub(crate) fn kind_from(bytes: &[u8]) -> Result<ParkedKind> {
    match bytes {
        b"poison" => Ok(ParkedKind::Poison),
        b"invalid" => Ok(ParkedKind::Invalid),
        other => Err(Error::store(
            StoreErrorKind::Corrupt,
            false,
            format!(
                "cannot decode a parked row's kind: {:?} is neither poison nor invalid",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}

/// A count read from the server (never negative) as `u64`.
pub(crate) fn count(what: &str, n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|e| Error::corrupt(format!("{what} (a negative count)"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bytes_are_corrupt_errors_naming_the_row() {
        let err = text("an item identity", vec![0xff, 0xfe]).unwrap_err();
        assert!(err.to_string().contains("an item identity"));
        let err = decode::<i64>("the state of a/b", b"{").unwrap_err();
        assert!(err.to_string().contains("the state of a/b"));
        assert!(raw_json("a payload", Some(b"nul".to_vec())).is_err());
        assert!(kind_from(b"other").is_err());
    }

    #[test]
    fn json_round_trips_byte_for_byte() {
        let text = r#"{"b":1,"a":12345678901234567890,"c":"\u00e9"}"#;
        let json = raw_json("a payload", Some(text.as_bytes().to_vec()))
            .unwrap()
            .unwrap();
        assert_eq!(json.as_str(), text);
    }
}
