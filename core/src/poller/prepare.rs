//! One raw item made into a candidate for the diff (or an invalid item with its issues).

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::ValidationIssue;
use crate::poller::builder::{CheckFn, FingerprintFn, Identity, IdentityFn, RawIdentityFn};
use crate::poller::{Candidate, CustomFingerprint, Prepare, Prepared};

/// The deepest nesting of arrays and objects an item may have (the item itself is level 1);
/// a deeper item is invalid (quarantined by default). Stored rows wrap an item in a few more
/// levels, and JSON parsers commonly stop at 128 (serde_json's default), so every store can read
/// back what it wrote.
pub const MAX_ITEM_DEPTH: usize = 100;

/// Whether `value` nests arrays and objects more than `max` levels deep (iterative: no stack
/// growth however deep the value is).
pub(crate) fn nested_deeper_than(value: &serde_json::Value, max: usize) -> bool {
    let mut stack = vec![(value, 1_usize)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            serde_json::Value::Array(_) | serde_json::Value::Object(_) if depth > max => {
                return true;
            }
            serde_json::Value::Array(items) => {
                stack.extend(items.iter().map(|child| (child, depth + 1)));
            }
            serde_json::Value::Object(map) => {
                stack.extend(map.values().map(|child| (child, depth + 1)));
            }
            _ => {}
        }
    }
    false
}

/// The value at a dot path as an identity: strings verbatim, numbers as JSON writes them.
pub(crate) fn field_string(value: &serde_json::Value, path: &str) -> Option<String> {
    let mut current = value;
    for segment in path.split('.') {
        current = match current {
            serde_json::Value::Object(map) => map.get(segment)?,
            serde_json::Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match current {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(super) fn make_prepare<T>(
    identity: Identity<T>,
    raw_identity: Option<RawIdentityFn>,
    version: Option<IdentityFn<T>>,
    custom_fingerprint: Option<FingerprintFn<T>>,
    check: Option<CheckFn<T>>,
) -> Arc<Prepare>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    Arc::new(move |raw: &serde_json::Value| {
        let raw_id = || raw_identity.as_ref().and_then(|f| f(raw));
        if nested_deeper_than(raw, MAX_ITEM_DEPTH) {
            let issue = ValidationIssue {
                message: format!(
                    "the item is nested deeper than {MAX_ITEM_DEPTH} levels of arrays and objects, which watukuy does not store"
                ),
                path: None,
            };
            return Prepared::Invalid {
                issues: vec![issue],
                identity: raw_id(),
            };
        }
        // Plain serde first; only a failure is decoded again, with its path tracked (most items
        // are valid, and tracking the path costs on every field).
        let item: T = match T::deserialize(raw).or_else(|_| serde_path_to_error::deserialize(raw)) {
            Ok(item) => item,
            Err(error) => {
                let path = error.path().to_string();
                let issue = ValidationIssue {
                    message: error.inner().to_string(),
                    path: (path != ".").then(|| path.split('.').map(str::to_owned).collect()),
                };
                return Prepared::Invalid {
                    issues: vec![issue],
                    identity: raw_id(),
                };
            }
        };
        if let Some(check) = &check
            && let Err(issues) = check(&item)
        {
            return Prepared::Invalid {
                issues,
                identity: raw_id(),
            };
        }
        let value = match serde_json::to_value(&item) {
            Ok(value) => value,
            Err(error) => {
                let issue = ValidationIssue {
                    message: format!("the item cannot be serialized: {error}"),
                    path: None,
                };
                return Prepared::Invalid {
                    issues: vec![issue],
                    identity: raw_id(),
                };
            }
        };
        let identity = match &identity {
            Identity::Typed(f) => f(&item),
            Identity::Field(path) => match field_string(&value, path) {
                Some(id) => id,
                None => {
                    let issue = ValidationIssue {
                        message: format!(
                            "identity field `{path}` is missing or not a string or number"
                        ),
                        path: Some(path.split('.').map(str::to_owned).collect()),
                    };
                    return Prepared::Invalid {
                        issues: vec![issue],
                        identity: None,
                    };
                }
            },
        };
        let version = version.as_ref().map(|f| f(&item));
        let custom_fingerprint = custom_fingerprint.as_ref().map(|f| {
            let f = Arc::clone(f);
            Box::new(move || f(&item)) as CustomFingerprint
        });
        Prepared::Valid(Candidate {
            identity,
            version,
            value,
            custom_fingerprint,
        })
    })
}
