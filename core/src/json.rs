//! [`Json`]: JSON text carried through the engine and the stores byte for byte.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Serializes `value` into the JSON text a store writes (`what` names it in the error). watukuy's
/// own types always serialize; a failure is still an error, not a panic: a non-transient store
/// error of kind [`Rejected`](crate::error::StoreErrorKind::Rejected).
///
/// ```
/// use watukuy_core::json::encode_for_store;
///
/// assert_eq!(encode_for_store("a state", &[1, 2]).unwrap(), "[1,2]");
/// ```
pub fn encode_for_store<T: Serialize + ?Sized>(what: &str, value: &T) -> crate::Result<String> {
    serde_json::to_string(value).map_err(|e| {
        crate::Error::store_with(
            crate::error::StoreErrorKind::Rejected,
            false,
            format!("cannot encode {what} as JSON"),
            e,
        )
    })
}

/// A piece of valid JSON text, kept exactly as it was written.
///
/// Payloads, cursors and raw items travel through the outbox and the stores as `Json`, so a store
/// never re-serializes them: big integers, key order and unicode escapes round-trip byte for byte.
/// Two values are equal when their texts are equal. The text is shared: cloning a `Json` (an
/// event handed to a handler, a row loaded from the memory store) copies a pointer, not the text.
#[derive(Clone)]
pub struct Json(Arc<RawValue>);

impl Json {
    /// Parses `text`, failing with the parser's message when it is not one JSON value.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text.to_owned()).map(Self::shared)
    }

    /// Serializes any value into compact JSON text.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self::shared)
    }

    /// Converts a [`serde_json::Value`] into JSON text (never fails: a `Value` is always valid).
    pub fn from_value(value: &serde_json::Value) -> Self {
        // A `Value` holds no non-string map keys and no non-finite numbers, so this cannot fail.
        Self::encode(value).unwrap_or_else(|_| Self::null())
    }

    /// The JSON `null` literal.
    pub fn null() -> Self {
        Self::shared(RawValue::NULL.to_owned())
    }

    fn shared(text: Box<RawValue>) -> Self {
        Self(Arc::from(text))
    }

    /// The JSON text exactly as stored.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Parses the text into a [`serde_json::Value`].
    pub fn to_value(&self) -> serde_json::Value {
        // The text is valid JSON by construction; `Value` accepts every valid JSON text.
        serde_json::from_str(self.0.get()).unwrap_or(serde_json::Value::Null)
    }

    /// Deserializes the text into a user type, failing with serde's message and path.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// True when the text is the JSON `null` literal.
    pub fn is_null(&self) -> bool {
        self.0.get() == "null"
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Json {}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<serde_json::Value> for Json {
    fn from(value: serde_json::Value) -> Self {
        Self::from_value(&value)
    }
}

impl std::str::FromStr for Json {
    type Err = serde_json::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self::shared)
    }
}

/// Serde helpers for an `Option<Json>` field where *absent* and JSON `null` differ.
///
/// Use with `#[serde(default, skip_serializing_if = "Option::is_none", with = "watukuy_core::json::present")]`:
/// a missing field is `None`, a field holding `null` is `Some(Json::null())`.
pub mod present {
    use super::Json;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes the text when present (callers skip the field when absent).
    pub fn serialize<S: Serializer>(
        value: &Option<Json>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(json) => json.serialize(serializer),
            None => serializer.serialize_none(),
        }
    }

    /// Reads a present field, `null` included, as `Some`.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Json>, D::Error> {
        Json::deserialize(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_text_byte_for_byte() {
        let text = r#"{"b":12345678901234567890123,"a":"\u00e9","c":[]}"#;
        let json = Json::parse(text).unwrap();
        assert_eq!(json.as_str(), text);
        let wrapped = serde_json::to_string(&vec![json.clone()]).unwrap();
        assert_eq!(wrapped, format!("[{text}]"));
        let back: Vec<Json> = serde_json::from_str(&wrapped).unwrap();
        assert_eq!(back[0], json);
    }

    #[test]
    fn rejects_invalid_text() {
        assert!(Json::parse("{").is_err());
        assert!(Json::parse("1 2").is_err());
    }

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Row {
        #[serde(default, skip_serializing_if = "Option::is_none", with = "present")]
        payload: Option<Json>,
    }

    #[test]
    fn present_keeps_null_apart_from_absent() {
        let absent: Row = serde_json::from_str("{}").unwrap();
        let null: Row = serde_json::from_str(r#"{"payload":null}"#).unwrap();
        assert_eq!(absent.payload, None);
        assert_eq!(null.payload, Some(Json::null()));
        assert_eq!(serde_json::to_string(&absent).unwrap(), "{}");
        assert_eq!(serde_json::to_string(&null).unwrap(), r#"{"payload":null}"#);
    }
}
