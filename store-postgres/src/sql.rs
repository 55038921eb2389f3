//! The SQL text of the store: versioned migrations and every statement, loaded from `sql/` and
//! specialised once per store with its validated, quoted table names.

use crate::options::PostgresOptions;

/// One versioned migration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    /// Its version: migrations run in increasing order, each once per schema and prefix.
    pub(crate) version: i32,
    /// A short name, recorded next to the version.
    pub(crate) name: &'static str,
    /// The DDL template (`{schema}` and `{prefix}` placeholders).
    pub(crate) template: &'static str,
}

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        template: include_str!("../sql/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "queue_indexes",
        template: include_str!("../sql/0002_queue_indexes.sql"),
    },
];

/// Creates the schema (run only when it is missing).
pub(crate) const SCHEMA_TEMPLATE: &str = include_str!("../sql/schema.sql");

/// Creates the table recording applied migrations.
pub(crate) const SCHEMA_VERSION_TEMPLATE: &str = include_str!("../sql/schema_version.sql");

/// Fills `{schema}` and `{prefix}` of a DDL template. Both were validated as plain identifiers
/// (`[A-Za-z_][A-Za-z0-9_]*`) and the templates always put them inside double quotes, so this
/// cannot change the statement's meaning.
pub(crate) fn render(template: &str, options: &PostgresOptions) -> String {
    template
        .replace("{schema}", &options.schema)
        .replace("{prefix}", &options.table_prefix)
}

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../sql/queries/", $name, ".sql"))
    };
}

/// Every statement of the store with its table names filled in, built once per store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) acquire_lease: String,
    pub(crate) has_pending: String,
    pub(crate) renew_lease: String,
    pub(crate) release_lease: String,
    pub(crate) get_lease: String,
    pub(crate) load_state: String,
    pub(crate) save_state: String,
    pub(crate) save_state_unfenced: String,
    pub(crate) list_keys: String,
    pub(crate) lock_key: String,
    pub(crate) delete_key: String,
    pub(crate) clear_items: String,
    pub(crate) load_versions: String,
    pub(crate) stream_identities: String,
    pub(crate) counts: String,
    pub(crate) commit_poll: String,
    pub(crate) load_pending: String,
    pub(crate) load_pending_with_holds: String,
    pub(crate) ack_events: String,
    pub(crate) record_attempt: String,
    pub(crate) park_event: String,
    pub(crate) list_parked: String,
    pub(crate) retry_parked: String,
    pub(crate) discard_parked: String,
    pub(crate) held_keys: String,
    pub(crate) get_validator: String,
    pub(crate) read_log: String,
    pub(crate) prune_log: String,
}

impl Statements {
    pub(crate) fn new(options: &PostgresOptions) -> Self {
        let table =
            |name: &str| format!("\"{}\".\"{}{name}\"", options.schema, options.table_prefix);
        let tables = [
            ("{pollers}", table("pollers")),
            ("{items}", table("items")),
            ("{outbox}", table("outbox")),
            ("{parked}", table("parked")),
            ("{validators}", table("validators")),
            ("{log}", table("log")),
        ];
        let state_assignments = query_file!("state_assignments").trim_end();
        let build = |template: &str| {
            let mut sql = template
                .replace("{state_assignments}", state_assignments)
                .replace("{load_pending}", query_file!("load_pending").trim_end());
            for (placeholder, name) in &tables {
                sql = sql.replace(placeholder, name);
            }
            sql
        };
        Self {
            acquire_lease: build(query_file!("acquire_lease")),
            has_pending: build(query_file!("has_pending")),
            renew_lease: build(query_file!("renew_lease")),
            release_lease: build(query_file!("release_lease")),
            get_lease: build(query_file!("get_lease")),
            load_state: build(query_file!("load_state")),
            save_state: build(query_file!("save_state")),
            save_state_unfenced: build(query_file!("save_state_unfenced")),
            list_keys: build(query_file!("list_keys")),
            lock_key: build(query_file!("lock_key")),
            delete_key: build(query_file!("delete_key")),
            clear_items: build(query_file!("clear_items")),
            load_versions: build(query_file!("load_versions")),
            stream_identities: build(query_file!("stream_identities")),
            counts: build(query_file!("counts")),
            commit_poll: build(query_file!("commit_poll")),
            load_pending: build(query_file!("load_pending")),
            load_pending_with_holds: build(query_file!("load_pending_with_holds")),
            ack_events: build(query_file!("ack_events")),
            record_attempt: build(query_file!("record_attempt")),
            park_event: build(query_file!("park_event")),
            list_parked: build(query_file!("list_parked")),
            retry_parked: build(query_file!("retry_parked")),
            discard_parked: build(query_file!("discard_parked")),
            held_keys: build(query_file!("held_keys")),
            get_validator: build(query_file!("get_validator")),
            read_log: build(query_file!("read_log")),
            prune_log: build(query_file!("prune_log")),
        }
    }
}

/// The whole DDL for `options`: the schema, the migrations table and every migration.
pub(crate) fn ddl(options: &PostgresOptions) -> String {
    let mut out = String::new();
    for template in [SCHEMA_TEMPLATE, SCHEMA_VERSION_TEMPLATE] {
        out.push_str(render(template, options).trim_end());
        out.push_str(";\n\n");
    }
    for migration in MIGRATIONS {
        out.push_str(render(migration.template, options).trim_end());
        out.push('\n');
        out.push_str(&format!(
            "INSERT INTO \"{}\".\"{}schema_version\" (version, name) VALUES ({}, '{}') ON CONFLICT (version) DO NOTHING;\n",
            options.schema, options.table_prefix, migration.version, migration.name
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        let options = PostgresOptions::default().schema("s").table_prefix("p_");
        let statements = Statements::new(&options);
        let all = format!("{statements:?}");
        for placeholder in [
            "{pollers}",
            "{items}",
            "{outbox}",
            "{parked}",
            "{validators}",
            "{log}",
            "{state_assignments}",
        ] {
            assert!(
                !all.contains(placeholder),
                "{placeholder} left in a statement"
            );
        }
        assert!(statements.commit_poll.contains("\"s\".\"p_pollers\""));
        let ddl = ddl(&options);
        assert!(!ddl.contains("{schema}") && !ddl.contains("{prefix}"));
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"s\".\"p_outbox\""));
        assert!(ddl.contains("\"p_outbox_queue_idx\""));
        assert!(ddl.contains("DROP INDEX IF EXISTS \"s\".\"p_outbox_pending_idx\""));
    }

    /// Every identifier the DDL derives from the prefix is in `DERIVED_NAMES` (which bounds the
    /// prefix's length), and with the longest prefix the options accept, none is longer than
    /// PostgreSQL's 63 bytes (longer ones would be truncated, and could collide).
    #[test]
    fn derived_names_fit_postgres_identifiers() {
        let derived = |prefix: &str| -> Vec<String> {
            let options = PostgresOptions::default().schema("s").table_prefix(prefix);
            let ddl = ddl(&options);
            let quoted = format!("\"{prefix}");
            ddl.match_indices(&quoted)
                .map(|(at, _)| {
                    let rest = &ddl[at + 1..];
                    rest[..rest.find('"').unwrap_or(rest.len())].to_owned()
                })
                .collect()
        };
        let names = derived("pfx_");
        assert!(!names.is_empty());
        for name in &names {
            let suffix = name.strip_prefix("pfx_").unwrap_or(name);
            assert!(
                crate::options::DERIVED_NAMES.contains(&suffix),
                "{suffix} is missing from options::DERIVED_NAMES"
            );
        }
        let mut longest_prefix = "p".repeat(63);
        while PostgresOptions::default()
            .table_prefix(longest_prefix.as_str())
            .validate()
            .is_err()
        {
            longest_prefix.pop();
        }
        assert_eq!(longest_prefix.len(), 45, "the documented limit");
        for name in derived(&longest_prefix) {
            assert!(name.len() <= 63, "{name} is {} bytes", name.len());
        }
    }

    #[test]
    fn schema_version_is_the_last_migration() {
        assert_eq!(
            MIGRATIONS.last().map(|m| m.version),
            Some(crate::SCHEMA_VERSION)
        );
    }

    #[test]
    fn migrations_are_strictly_increasing() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(versions.first(), Some(&1));
    }
}
