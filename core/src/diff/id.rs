//! Deterministic event ids (guarantee G2), byte-identical to those of the TypeScript reference
//! implementation: the same observation gets the same id in both.

use std::io::Write as _;

use sha2::{Digest, Sha256};
use smol_str::SmolStr;

use crate::event::EventType;

/// What an event id is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventIdParts<'a> {
    /// The event source (`urn:watukuy:<poller>` by default).
    pub source: &'a str,
    /// The partition key (`""` for none).
    pub partition: &'a str,
    /// The item's identity.
    pub identity: &'a str,
    /// The item's version if the poller has a version selector, else its fingerprint hash; for
    /// deletes, the stored row's `version` or else its `hash`.
    pub version_or_hash: &'a str,
    /// The poller's schema version.
    pub schema_version: u32,
    /// The event type.
    pub event_type: EventType,
}

/// `watukuy|v1|<source>|<partition>|<identity>|<version-or-hash>|<schemaVersion>|<type>`, each
/// part with `\` and `|` escaped by a backslash.
///
/// Backslashes are escaped first (`\` → `\\`), then pipes (`|` → `\|`), so the material splits
/// back into its parts unambiguously: `a` + `|b` and `a|` + `b` give different ids. (The tests'
/// spelling of what [`event_id_text`] hashes without writing it out.)
#[cfg(test)]
pub(crate) fn event_id_material(parts: &EventIdParts<'_>) -> String {
    let schema_version = parts.schema_version.to_string();
    let variable = [
        parts.source,
        parts.partition,
        parts.identity,
        parts.version_or_hash,
    ];
    let len: usize = variable.iter().map(|part| part.len() + 1).sum();
    let mut material = String::with_capacity(len + 32);
    material.push_str("watukuy|v1");
    for part in variable {
        material.push('|');
        push_escaped(&mut material, part);
    }
    material.push('|');
    material.push_str(&schema_version);
    material.push('|');
    material.push_str(parts.event_type.as_str());
    material
}

/// Appends `part` with `\` written as `\\` and `|` as `\|` (one pass, equivalent to replacing
/// backslashes first and pipes second).
#[cfg(test)]
fn push_escaped(material: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '\\' => material.push_str("\\\\"),
            '|' => material.push_str("\\|"),
            c => material.push(c),
        }
    }
}

/// An event's id: the SHA-256 hex of
/// `watukuy|v1|<source>|<partition>|<identity>|<version-or-hash>|<schemaVersion>|<type>`, each
/// part with `\` escaped first (`\` → `\\`), then `|` (`|` → `\|`), so the parts cannot shift
/// (`a` + `|b` and `a|` + `b` give different ids). Byte-identical to the TypeScript reference.
pub fn event_id(parts: &EventIdParts<'_>) -> String {
    event_id_text(parts).to_string()
}

/// [`event_id`] as the event stores it: the material is hashed as it is written (no buffer) and
/// the hex digits made on the stack, so the id costs one allocation.
pub(crate) fn event_id_text(parts: &EventIdParts<'_>) -> SmolStr {
    let mut sha = Sha256::new();
    sha.update(b"watukuy|v1");
    for part in [
        parts.source,
        parts.partition,
        parts.identity,
        parts.version_or_hash,
    ] {
        sha.update(b"|");
        // The escaped characters are ASCII, so a byte-wise split never cuts a UTF-8 sequence.
        let mut rest = part.as_bytes();
        while let Some(at) = rest.iter().position(|b| matches!(b, b'\\' | b'|')) {
            sha.update(&rest[..at]);
            sha.update([b'\\', rest[at]]);
            rest = &rest[at + 1..];
        }
        sha.update(rest);
    }
    // Written straight into the hash (writing to a hasher cannot fail).
    let _ = write!(
        sha,
        "|{}|{}",
        parts.schema_version,
        parts.event_type.as_str()
    );
    let hex = super::hash::hex_digest(sha.finalize().into());
    SmolStr::new(std::str::from_utf8(&hex).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(partition: &'a str, identity: &'a str) -> EventIdParts<'a> {
        EventIdParts {
            source: "urn:watukuy:orders",
            partition,
            identity,
            version_or_hash: "v1",
            schema_version: 1,
            event_type: EventType::Created,
        }
    }

    /// Splits a material string back into its eight parts, undoing the escaping.
    fn split(material: &str) -> Vec<String> {
        let mut fields = vec![String::new()];
        let mut chars = material.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => fields
                    .last_mut()
                    .unwrap()
                    .push(chars.next().expect("dangling escape")),
                '|' => fields.push(String::new()),
                c => fields.last_mut().unwrap().push(c),
            }
        }
        fields
    }

    #[test]
    fn the_streamed_id_hashes_exactly_the_material() {
        let long = "x".repeat(300);
        let tricky = [
            "",
            "a",
            "|",
            "\\",
            "a|b\\c",
            "\\|",
            "||\\\\",
            "ünï|cödé\\",
            long.as_str(),
        ];
        for (i, a) in tricky.iter().enumerate() {
            for b in &tricky {
                let parts = EventIdParts {
                    source: a,
                    partition: b,
                    identity: a,
                    version_or_hash: b,
                    schema_version: [0, 1, 9, 10, 4_294_967_295][i % 5],
                    event_type: EventType::Deleted,
                };
                assert_eq!(
                    event_id(&parts),
                    crate::diff::sha256_hex(event_id_material(&parts).as_bytes()),
                    "{parts:?}"
                );
            }
        }
    }

    #[test]
    fn reference_vector() {
        let parts = parts("", "o1");
        assert_eq!(
            event_id_material(&parts),
            "watukuy|v1|urn:watukuy:orders||o1|v1|1|created"
        );
        assert_eq!(
            event_id(&parts),
            "5dc9ec28d4ec668a7add37c6a32e916f839cd6d98ee013de30acd06b32599862"
        );
    }

    #[test]
    fn every_part_and_type_is_in_the_material() {
        // Expected ids computed independently with `printf '%s' MATERIAL | sha256sum`.
        let updated = EventIdParts {
            version_or_hash: "v2",
            event_type: EventType::Updated,
            ..parts("", "o1")
        };
        assert_eq!(
            event_id_material(&updated),
            "watukuy|v1|urn:watukuy:orders||o1|v2|1|updated"
        );
        assert_eq!(
            event_id(&updated),
            "15066d686cd531f67a045b6d3869ae3af44228db8b92dffad4e15c786fb6ad21"
        );

        let deleted = EventIdParts {
            version_or_hash: "5dc9ec28d4ec668a7add37c6a32e916f839cd6d98ee013de30acd06b32599862",
            schema_version: 12,
            event_type: EventType::Deleted,
            ..parts("tenant-7", "o1")
        };
        assert_eq!(
            event_id_material(&deleted),
            "watukuy|v1|urn:watukuy:orders|tenant-7|o1|\
             5dc9ec28d4ec668a7add37c6a32e916f839cd6d98ee013de30acd06b32599862|12|deleted"
        );
        assert_eq!(
            event_id(&deleted),
            "9a2386feb13d4764fc1c86acfd268058d90cc614d0a627926b6b37bd1dac5f07"
        );
    }

    #[test]
    fn pipes_are_escaped_so_parts_cannot_shift() {
        let left = parts("a", "|b");
        let right = parts("a|", "b");
        assert_eq!(
            event_id_material(&left),
            r"watukuy|v1|urn:watukuy:orders|a|\|b|v1|1|created"
        );
        assert_eq!(
            event_id_material(&right),
            r"watukuy|v1|urn:watukuy:orders|a\||b|v1|1|created"
        );
        assert_eq!(
            event_id(&left),
            "5c2c62cd433c0b8ecd0d38f51040ea4105f53728ce840d7c1c05653a10909935"
        );
        assert_eq!(
            event_id(&right),
            "9ad8f386fc5a92f8a6d2bd0107b05fd619b2fcc2abe8edf73f4ede9ce4a1d8a9"
        );
        assert_ne!(event_id(&left), event_id(&right));
    }

    #[test]
    fn backslashes_are_escaped_before_pipes() {
        // `a\` + `|b`: the backslash doubles, then the pipe gets its own backslash.
        let escaped = parts(r"a\", "|b");
        assert_eq!(
            event_id_material(&escaped),
            r"watukuy|v1|urn:watukuy:orders|a\\|\|b|v1|1|created"
        );
        assert_eq!(
            event_id(&escaped),
            "cca79e1aff7925314dd1a19d57c94831cc303490b1c9c12e9daa6a47fc0bac93"
        );
        // Escaping only pipes would give both of these `a\|b\|c`; escaping backslashes too keeps
        // them apart.
        let left = parts(r"a\", "b|c");
        let right = parts(r"a|b\", "c");
        assert_eq!(
            event_id_material(&left),
            r"watukuy|v1|urn:watukuy:orders|a\\|b\|c|v1|1|created"
        );
        assert_eq!(
            event_id_material(&right),
            r"watukuy|v1|urn:watukuy:orders|a\|b\\|c|v1|1|created"
        );
        assert_ne!(event_id(&left), event_id(&right));
        for other in [parts("a", r"\|b"), parts(r"a\|", "b"), parts(r"a\\", "|b")] {
            assert_ne!(event_id_material(&escaped), event_id_material(&other));
        }
    }

    #[test]
    fn material_splits_back_into_its_parts() {
        let awkward = [
            "", "|", "\\", "\\|", "|\\", "a|b", "a\\b", "a\\", "\\\\|", "||", "é|😀",
        ];
        for source in ["urn:watukuy:x", "s|\\"] {
            for partition in awkward {
                for identity in awkward {
                    for version in ["v1", "|", "\\"] {
                        let parts = EventIdParts {
                            source,
                            partition,
                            identity,
                            version_or_hash: version,
                            schema_version: 3,
                            event_type: EventType::Deleted,
                        };
                        assert_eq!(
                            split(&event_id_material(&parts)),
                            [
                                "watukuy", "v1", source, partition, identity, version, "3",
                                "deleted"
                            ],
                        );
                    }
                }
            }
        }
    }
}
