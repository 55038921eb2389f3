//! The key layout, with Redis Cluster hash tags.
//!
//! Every key of one `(poller, partition)` is `<prefix>p:{<poller>:<partition>}:<part>`, with the
//! poller and the partition escaped so that the part between the braces — the key's cluster hash
//! tag — never contains `{`, `}` or an unescaped `:`. All of a key's data therefore lands in one
//! cluster slot, which is what lets every write of a key be one Lua script, and two different
//! `(poller, partition)` pairs can never share a name (`a:b`/`c` and `a`/`b:c` differ).
//!
//! The lists behind `list_keys` share the literal tag `{keys}` (one slot of their own): a set of
//! poller names and, per poller, a set of its partitions.

use watukuy_core::store::PKey;

/// Escapes a name for use inside a hash tag: `%`, `{`, `}` and `:` become `%25`, `%7B`, `%7D`
/// and `%3A`; everything else (unicode included) is kept. Injective, and the result never
/// contains a brace or a colon.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    out
}

/// Every key of one `(poller, partition)`.
#[derive(Clone, Debug)]
pub(crate) struct KeyKeys {
    /// Hash: `owner`, `epoch`, `expires_at` (the lease) and `epoch_counter`.
    pub(crate) meta: String,
    /// Hash: one JSON field per top-level field of `PollerState`.
    pub(crate) state: String,
    /// Hash: identity → `ItemRow` JSON.
    pub(crate) items: String,
    /// Sorted set (all scores 0): the identities, for keyset paging in byte order.
    pub(crate) ids: String,
    /// Sorted set: pending event ids scored by sequence.
    pub(crate) outbox: String,
    /// Hash: event id → `OutboxRow` JSON as committed.
    pub(crate) rows: String,
    /// Hash: event id → failed attempts recorded since the row was committed.
    pub(crate) attempts: String,
    /// Hash: event id → `{"lastError":…,"nextAttemptAt":…}` of the last recorded attempt.
    pub(crate) errors: String,
    /// Hash: parked id → `ParkedRow` JSON.
    pub(crate) parked: String,
    /// Hash: parked id → hold key (rows without one are absent).
    pub(crate) hold: String,
    /// Hash: URL hash → `Validator` JSON.
    pub(crate) validators: String,
    /// Sorted set: logged sequences scored by sequence.
    pub(crate) log: String,
    /// Hash: sequence → `LoggedEvent` JSON.
    pub(crate) log_rows: String,
    /// Sorted set: logged sequences scored by `created_at`.
    pub(crate) log_at: String,
}

impl KeyKeys {
    /// Every key but `meta`, which `delete_key` keeps for its epoch counter.
    pub(crate) fn data(&self) -> [&str; 13] {
        [
            &self.state,
            &self.items,
            &self.ids,
            &self.outbox,
            &self.rows,
            &self.attempts,
            &self.errors,
            &self.parked,
            &self.hold,
            &self.validators,
            &self.log,
            &self.log_rows,
            &self.log_at,
        ]
    }
}

/// Key names under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct KeySpace {
    prefix: String,
}

impl KeySpace {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>p:{<poller>:<partition>}`: the common start of a key's names.
    pub(crate) fn base(&self, key: &PKey) -> String {
        format!(
            "{}p:{{{}:{}}}",
            self.prefix,
            escape(&key.poller),
            escape(&key.partition)
        )
    }

    pub(crate) fn of(&self, key: &PKey) -> KeyKeys {
        let base = self.base(key);
        let name = |part: &str| format!("{base}:{part}");
        KeyKeys {
            meta: name("meta"),
            state: name("state"),
            items: name("items"),
            ids: name("items:ids"),
            outbox: name("outbox"),
            rows: name("outbox:rows"),
            attempts: name("outbox:attempts"),
            errors: name("outbox:errors"),
            parked: name("parked"),
            hold: name("parked:hold"),
            validators: name("validators"),
            log: name("log"),
            log_rows: name("log:rows"),
            log_at: name("log:at"),
        }
    }

    /// `<prefix>{keys}:pollers`: the set of pollers with at least one listed key.
    pub(crate) fn pollers(&self) -> String {
        format!("{}{{keys}}:pollers", self.prefix)
    }

    /// `<prefix>{keys}:partitions:<poller>`: the set of a poller's listed partitions.
    pub(crate) fn partitions(&self, poller: &str) -> String {
        format!("{}{{keys}}:partitions:{}", self.prefix, escape(poller))
    }

    /// `<prefix>budget:{<name>}`: the token bucket of a rate budget.
    pub(crate) fn budget(&self, name: &str) -> String {
        format!("{}budget:{{{}}}", self.prefix, escape(name))
    }
}

/// The cluster hash tag of a key name, as Redis computes it: the text between the first `{` and
/// the first `}` after it, if non-empty; otherwise the whole name.
pub(crate) fn hash_tag(name: &str) -> &str {
    if let Some(open) = name.find('{')
        && let Some(len) = name[open + 1..].find('}')
        && len > 0
    {
        return &name[open + 1..open + 1 + len];
    }
    name
}

/// The Redis Cluster slot of a key name: CRC16 (XMODEM) of its hash tag, modulo 16384.
pub(crate) fn slot(name: &str) -> u16 {
    let mut crc: u16 = 0;
    for byte in hash_tag(name).bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_injective_and_brace_free() {
        assert_eq!(escape("a:b{c}%d é"), "a%3Ab%7Bc%7D%25d é");
        assert_ne!(escape("%3A"), escape(":"));
        let space = KeySpace::new("w:");
        assert_ne!(
            space.base(&PKey::new("a:b", "c")),
            space.base(&PKey::new("a", "b:c"))
        );
        assert_ne!(
            space.base(&PKey::new("a", "")),
            space.base(&PKey::new("", "a"))
        );
    }

    #[test]
    fn every_key_of_a_pkey_shares_one_hash_tag() {
        let space = KeySpace::new("watukuy:");
        for key in [
            PKey::new("orders", ""),
            PKey::new("", ""),
            PKey::new("{x}", "}{"),
            PKey::new("a:b", "c:d"),
            PKey::new("ünï", "tenant-ß"),
        ] {
            let keys = space.of(&key);
            let tag = hash_tag(&keys.meta).to_owned();
            assert_eq!(
                tag,
                format!("{}:{}", escape(&key.poller), escape(&key.partition))
            );
            for name in keys.data() {
                assert_eq!(hash_tag(name), tag, "{name}");
            }
        }
        assert_eq!(hash_tag(&space.pollers()), "keys");
        assert_eq!(hash_tag(&space.partitions("{evil}")), "keys");
        assert_eq!(hash_tag(&space.budget("api:{1}")), "api%3A%7B1%7D");
    }

    #[test]
    fn slots_are_crc16_of_the_hash_tag() {
        // The reference value of the Redis Cluster specification: CRC16-XMODEM("123456789").
        assert_eq!(slot("123456789"), 0x31C3);
        assert_eq!(slot("user:{1000}:following"), slot("1000"));
        assert_eq!(hash_tag("foo{}{bar}"), "foo{}{bar}");
        // Values `redis-cli CLUSTER KEYSLOT` answers.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{keys}:pollers"), slot("keys"));
        let space = KeySpace::new("watukuy:");
        let keys = space.of(&PKey::new("orders", "t1"));
        for name in keys.data() {
            assert_eq!(slot(name), slot(&keys.meta), "{name}");
        }
    }

    #[test]
    fn layout_is_documented() {
        let keys = KeySpace::new("watukuy:").of(&PKey::new("orders", "t1"));
        assert_eq!(keys.meta, "watukuy:p:{orders:t1}:meta");
        assert_eq!(keys.ids, "watukuy:p:{orders:t1}:items:ids");
        assert_eq!(keys.log_at, "watukuy:p:{orders:t1}:log:at");
    }
}
