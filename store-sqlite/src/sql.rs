//! The SQL of the store: asset files under `sql/`, with the table prefix spliced in once.

use std::collections::HashMap;

use watukuy_core::Result;

use crate::options::validate_prefix;

/// The placeholder of the table prefix in every SQL file.
const PREFIX: &str = "{prefix}";

/// The placeholder of an `IN` list in the chunked statements.
const IDS: &str = "{ids}";

/// The most identifiers bound in one `IN (...)` list; longer lists are split into chunks.
pub(crate) const IN_CHUNK: usize = 500;

/// Creates the prefix's schema-version table.
const SCHEMA_VERSION_SQL: &str = include_str!("../sql/schema_version.sql");

/// Every named statement.
const QUERIES_SQL: &str = include_str!("../sql/queries.sql");

/// One versioned migration: applied once per prefix, in order, inside one transaction.
pub(crate) struct Migration {
    /// Its version (1, 2, ...).
    pub(crate) version: i64,
    /// Its SQL, with `{prefix}` placeholders; idempotent.
    pub(crate) sql: &'static str,
}

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    sql: include_str!("../sql/migrations/0001_init.sql"),
}];

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 1;

/// The complete, idempotent DDL of the current schema for `prefix` (see `SqliteStore::ddl`).
pub(crate) fn ddl(prefix: &str) -> Result<String> {
    validate_prefix(prefix)?;
    let mut out = splice(SCHEMA_VERSION_SQL, prefix);
    for migration in MIGRATIONS {
        out.push('\n');
        out.push_str(&splice(migration.sql, prefix));
        out.push_str(&format!(
            "\nINSERT OR IGNORE INTO {prefix}schema_version (version) VALUES ({});\n",
            migration.version
        ));
    }
    Ok(out)
}

/// `sql` with the prefix spliced in (the prefix is a validated identifier).
pub(crate) fn splice(sql: &str, prefix: &str) -> String {
    sql.replace(PREFIX, prefix)
}

/// `template` with its `{ids}` replaced by `count` placeholders numbered from `first`.
pub(crate) fn in_list(template: &str, first: usize, count: usize) -> String {
    let ids: Vec<String> = (first..first + count).map(|n| format!("?{n}")).collect();
    template.replace(IDS, &ids.join(", "))
}

/// Splits `sql/queries.sql` into its named statements.
fn named_statements(text: &str) -> HashMap<&str, String> {
    let mut out = HashMap::new();
    let mut current: Option<(&str, Vec<&str>)> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("-- name:") {
            if let Some((name, body)) = current.take() {
                out.insert(name, finish(&body));
            }
            current = Some((name.trim(), Vec::new()));
        } else if let Some((_, body)) = &mut current {
            body.push(line);
        }
    }
    if let Some((name, body)) = current {
        out.insert(name, finish(&body));
    }
    out
}

fn finish(lines: &[&str]) -> String {
    lines
        .join("\n")
        .trim()
        .trim_end_matches(';')
        .trim_end()
        .to_owned()
}

macro_rules! statements {
    ($($name:ident),* $(,)?) => {
        /// Every statement of the store with the table prefix spliced in.
        #[derive(Debug)]
        pub(crate) struct Sql {
            /// The prefix's schema-version table DDL.
            pub(crate) schema_version_ddl: String,
            $(pub(crate) $name: String,)*
        }

        impl Sql {
            /// The names of every statement `sql/queries.sql` must define.
            #[cfg(test)]
            pub(crate) const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// The statement called `name` (tests look statements up by name).
            #[cfg(test)]
            pub(crate) fn by_name(&self, name: &str) -> Option<&str> {
                match name {
                    $(stringify!($name) => Some(&self.$name),)*
                    _ => None,
                }
            }

            /// The statements for a validated `prefix`.
            pub(crate) fn new(prefix: &str) -> Self {
                let named = named_statements(QUERIES_SQL);
                // A name missing from the file leaves an empty statement, which fails loudly
                // when prepared; the unit tests check that every name is there.
                let get = |name: &str| {
                    named.get(name).map(|sql| splice(sql, prefix)).unwrap_or_default()
                };
                Self {
                    schema_version_ddl: splice(SCHEMA_VERSION_SQL, prefix),
                    $($name: get(stringify!($name)),)*
                }
            }
        }
    };
}

statements! {
    schema_current,
    schema_record,
    lease_acquire,
    lease_renew,
    lease_release,
    lease_get,
    lease_holder,
    state_get,
    state_set,
    state_upsert,
    keys_list,
    key_forget,
    items_clear,
    items_upsert,
    items_delete_in,
    items_load_in,
    items_first_page,
    items_next_page,
    key_counts,
    outbox_clear,
    outbox_upsert,
    outbox_delete,
    outbox_pending,
    outbox_attempt,
    parked_clear,
    parked_upsert,
    parked_list,
    parked_held,
    parked_retryable_in,
    parked_delete,
    parked_delete_in,
    validators_clear,
    validator_get,
    validator_set,
    log_clear,
    log_upsert,
    log_read,
    log_prune,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_named_once_and_used() {
        let named = named_statements(QUERIES_SQL);
        let mut in_file: Vec<&str> = named.keys().copied().collect();
        in_file.sort_unstable();
        let mut expected: Vec<&str> = Sql::NAMES.to_vec();
        expected.sort_unstable();
        assert_eq!(in_file, expected);
        let count = QUERIES_SQL
            .lines()
            .filter(|line| line.starts_with("-- name:"))
            .count();
        assert_eq!(count, Sql::NAMES.len(), "a statement name is repeated");
    }

    #[test]
    fn every_statement_prepares_on_the_migrated_schema() {
        for prefix in ["", "watukuy_", "t_"] {
            let conn = rusqlite::Connection::open_in_memory().expect("in-memory database");
            conn.execute_batch(&ddl(prefix).expect("ddl"))
                .expect("the DDL runs");
            let sql = Sql::new(prefix);
            for name in Sql::NAMES {
                let text = sql.by_name(name).unwrap_or_default();
                assert!(!text.is_empty(), "{name} is empty");
                assert!(!text.contains(PREFIX), "{name} kept a prefix placeholder");
                let text = in_list(text, 3, 2);
                conn.prepare(&text)
                    .unwrap_or_else(|e| panic!("{name} does not prepare: {e}\n{text}"));
            }
        }
    }

    #[test]
    fn ddl_is_idempotent_and_rejects_bad_prefixes() {
        let conn = rusqlite::Connection::open_in_memory().expect("in-memory database");
        let text = ddl("x_").expect("ddl");
        conn.execute_batch(&text).expect("first run");
        conn.execute_batch(&text).expect("second run");
        let version: i64 = conn
            .query_row("SELECT MAX(version) FROM x_schema_version", [], |r| {
                r.get(0)
            })
            .expect("version");
        assert_eq!(version, i64::from(SCHEMA_VERSION));
        assert!(ddl("x-y").is_err());
        assert_eq!(
            MIGRATIONS.last().map(|m| m.version),
            Some(i64::from(SCHEMA_VERSION)),
            "SCHEMA_VERSION is the last migration"
        );
    }

    #[test]
    fn in_lists_number_their_placeholders() {
        assert_eq!(in_list("x IN ({ids})", 3, 3), "x IN (?3, ?4, ?5)");
    }
}
