//! The change engine: canonical JSON, fingerprints, event ids and the diff decisions.

mod canonical;
mod hash;
mod id;

pub use canonical::{CanonicalError, canonicalize};
pub use hash::{fingerprint, hash_url, sha256_hex};
pub(crate) use id::event_id_text;
pub use id::{EventIdParts, event_id};
