//! Store URLs: `sqlite:<path>`, `postgres://…`, `mysql://…` and `redis://…` (`rediss://` over
//! TLS, `redis+cluster://` and `rediss+cluster://` for Redis Cluster), parsed and opened.

use std::path::PathBuf;
use std::sync::Arc;

use watukuy_core::store::Store;
use watukuy_store_mysql::{MySqlOptions, MySqlStore};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};
use watukuy_store_redis::{RedisOptions, RedisStore};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

use crate::CliError;
use crate::args::CommonArgs;

/// Where the store is, parsed from a URL.
///
/// ```
/// use watukuy_cli::StoreUrl;
///
/// assert_eq!(
///     StoreUrl::parse("sqlite:watukuy.db").unwrap(),
///     StoreUrl::Sqlite("watukuy.db".into())
/// );
/// assert_eq!(
///     StoreUrl::parse("sqlite:///var/lib/app/watukuy.db").unwrap(),
///     StoreUrl::Sqlite("/var/lib/app/watukuy.db".into())
/// );
/// let pg = StoreUrl::parse("postgres://app:secret@db.internal/app").unwrap();
/// assert_eq!(pg.to_string(), "postgres://app:***@db.internal/app");
/// let my = StoreUrl::parse("mysql://app:secret@db.internal:3306/app").unwrap();
/// assert_eq!(my.to_string(), "mysql://app:***@db.internal:3306/app");
/// assert!(StoreUrl::parse("mongodb://db/app").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite database file (`sqlite:<path>`, `sqlite://<path>`).
    Sqlite(PathBuf),
    /// A PostgreSQL database (`postgres://…` or `postgresql://…`, passed to the driver as is).
    Postgres(String),
    /// A MySQL or MariaDB database (`mysql://user:password@host:port/database`, with the
    /// driver's parameters such as `?ssl-mode=REQUIRED`), passed to the driver as is.
    MySql(String),
    /// A Redis server or cluster (`redis://…`, `rediss://…` over TLS, `redis+cluster://h1:p1,h2:p2`
    /// or `rediss+cluster://…` for Redis Cluster; TLS files as `?tls_ca_file=<path>`), passed to
    /// the store as is.
    Redis(String),
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a password, not even in debug output.
        write!(f, "StoreUrl({self})")
    }
}

impl std::fmt::Display for StoreUrl {
    /// The URL with any password replaced by `***`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Postgres(url) | StoreUrl::MySql(url) | StoreUrl::Redis(url) => {
                f.write_str(&redact(url))
            }
        }
    }
}

/// Which backend-specific options apply, checked against the URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// PostgreSQL only: the schema holding the tables (default `public`).
    pub schema: Option<String>,
    /// SQLite, PostgreSQL and MySQL: the table prefix (default `watukuy_`); Redis: the key prefix
    /// (default `watukuy:`).
    pub prefix: Option<String>,
    /// PostgreSQL only: the URL is a pooler in transaction mode
    /// ([`PostgresOptions::transaction_pooling`]).
    pub transaction_pooling: bool,
    /// PostgreSQL and MySQL: the pool's size (default 2, enough for one command; a service's
    /// daemon uses 10).
    pub max_connections: Option<u32>,
}

/// The store the command line names (`--store`, else `WATUKUY_STORE`, else `default`), and
/// its options from the same command line, with a pool of `max_connections`.
pub(crate) fn store_from(
    args: &CommonArgs,
    default: Option<&str>,
    max_connections: Option<u32>,
) -> Result<(StoreUrl, StoreOptions), CliError> {
    let Some(url) = args.store.as_deref().or(default) else {
        return Err(CliError::usage(
            "no store: pass --store <URL> or set WATUKUY_STORE (sqlite:<path>, postgres://…, mysql://…, redis://…)",
        ));
    };
    let options = StoreOptions {
        schema: args.schema.clone(),
        prefix: args.prefix.clone(),
        transaction_pooling: args.transaction_pooling,
        max_connections,
    };
    Ok((StoreUrl::parse(url)?, options))
}

impl StoreUrl {
    /// Parses a store URL. Anything but `sqlite:`, `postgres://`, `postgresql://`, `mysql://`,
    /// `redis://`,
    /// `rediss://`, `redis+cluster://` and `rediss+cluster://` is a `CONFIG` error (exit code 1)
    /// saying what is accepted.
    pub fn parse(url: &str) -> Result<Self, CliError> {
        let url = url.trim();
        let accepted = "expected sqlite:<path>, postgres://user@host/database, \
                        mysql://user@host/database, redis://host:port (rediss:// for TLS) or \
                        redis+cluster://host:port,host:port";
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(CliError::config(format!(
                    "store URL '{url}' names no file; {accepted}"
                )));
            }
            if path == ":memory:" {
                return Err(CliError::config(
                    "store URL 'sqlite::memory:' is a private in-memory database: it holds \
                     nothing another process wrote; name the database file instead",
                ));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some("postgres" | "postgresql") => Ok(StoreUrl::Postgres(url.to_owned())),
            Some("mysql") => Ok(StoreUrl::MySql(url.to_owned())),
            Some("redis" | "rediss" | "redis+cluster" | "rediss+cluster") => {
                Ok(StoreUrl::Redis(url.to_owned()))
            }
            _ => Err(CliError::config(format!(
                "unsupported store URL '{}'; {accepted}",
                redact(url)
            ))),
        }
    }

    /// Opens the store. `create` allows a SQLite file that does not exist yet (for `migrate`);
    /// otherwise a missing file is an error instead of an empty new database.
    pub async fn open(
        &self,
        options: &StoreOptions,
        create: bool,
    ) -> Result<Arc<dyn Store>, CliError> {
        let wrong = |option: &str, backend: &str| {
            CliError::usage(format!("--{option} does not apply to a {backend} store"))
        };
        match self {
            StoreUrl::Sqlite(path) => {
                if options.schema.is_some() {
                    return Err(wrong("schema", "SQLite"));
                }
                if options.transaction_pooling {
                    return Err(wrong("transaction-pooling", "SQLite"));
                }
                if !create && !path.is_file() {
                    return Err(CliError::new(
                        "STORE",
                        format!(
                            "no SQLite database at {} (run `watukuy migrate` to create one)",
                            path.display()
                        ),
                    ));
                }
                let mut sqlite = SqliteOptions::file(path.clone());
                if let Some(prefix) = &options.prefix {
                    sqlite = sqlite.table_prefix(prefix.clone());
                }
                Ok(Arc::new(SqliteStore::open(sqlite)?))
            }
            StoreUrl::Postgres(url) => {
                let mut pg = PostgresOptions::default()
                    .max_connections(options.max_connections.unwrap_or(2));
                if let Some(schema) = &options.schema {
                    pg = pg.schema(schema.clone());
                }
                if let Some(prefix) = &options.prefix {
                    pg = pg.table_prefix(prefix.clone());
                }
                pg = pg.transaction_pooling(options.transaction_pooling);
                Ok(Arc::new(PostgresStore::connect(url, pg).await?))
            }
            StoreUrl::MySql(url) => {
                if options.schema.is_some() {
                    return Err(wrong("schema", "MySQL"));
                }
                if options.transaction_pooling {
                    return Err(wrong("transaction-pooling", "MySQL"));
                }
                let mut my =
                    MySqlOptions::default().max_connections(options.max_connections.unwrap_or(2));
                if let Some(prefix) = &options.prefix {
                    my = my.table_prefix(prefix.clone());
                }
                Ok(Arc::new(MySqlStore::connect(url, my).await?))
            }
            StoreUrl::Redis(url) => {
                if options.schema.is_some() {
                    return Err(wrong("schema", "Redis"));
                }
                if options.transaction_pooling {
                    return Err(wrong("transaction-pooling", "Redis"));
                }
                let mut redis = RedisOptions::default();
                if let Some(prefix) = &options.prefix {
                    redis = redis.prefix(prefix.clone());
                }
                Ok(Arc::new(RedisStore::connect(url, redis).await?))
            }
        }
    }
}

/// `scheme://user:password@host…` → `scheme://user:***@host…`; anything else unchanged.
///
/// The user information is everything before the URL's last `@`, so a password typed with `/`,
/// `?`, `#` or `@` in it (unencoded) is hidden whole; an `@` later in the URL (in a query) hides
/// more than the password, never less.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host_and_tail)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host_and_tail}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            StoreUrl::parse("sqlite:./a.db").unwrap(),
            StoreUrl::Sqlite("./a.db".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite://rel/a.db").unwrap(),
            StoreUrl::Sqlite("rel/a.db".into())
        );
        assert!(matches!(
            StoreUrl::parse("postgresql://h/db").unwrap(),
            StoreUrl::Postgres(_)
        ));
        assert!(matches!(
            StoreUrl::parse("mysql://root@127.0.0.1:3306/test").unwrap(),
            StoreUrl::MySql(u) if u == "mysql://root@127.0.0.1:3306/test"
        ));
        assert!(matches!(
            StoreUrl::parse(" redis://127.0.0.1:6379/2 ").unwrap(),
            StoreUrl::Redis(u) if u == "redis://127.0.0.1:6379/2"
        ));
        for url in [
            "rediss://cache:6380/0?tls_ca_file=/etc/ca.pem",
            "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
            "rediss+cluster://:pw@10.0.0.1:7000",
        ] {
            assert!(
                matches!(StoreUrl::parse(url).unwrap(), StoreUrl::Redis(u) if u == url),
                "{url}"
            );
        }
        assert_eq!(
            StoreUrl::parse("rediss+cluster://:pw@h:1,h:2")
                .unwrap()
                .to_string(),
            "rediss+cluster://:***@h:1,h:2"
        );
    }

    #[test]
    fn rejects_what_it_cannot_open() {
        for bad in [
            "",
            "sqlite:",
            "sqlite::memory:",
            "mongodb://h/db",
            "watukuy.db",
            "http://x",
        ] {
            let error = StoreUrl::parse(bad).unwrap_err();
            assert_eq!(
                (error.code.as_str(), error.exit_code),
                ("CONFIG", 1),
                "{bad}"
            );
        }
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db?x=1"), "postgres://u@h/db?x=1");
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
        let error = StoreUrl::parse("mongodb://root:hunter2@h/db").unwrap_err();
        assert!(!error.message.contains("hunter2"), "{}", error.message);
        let mysql = StoreUrl::parse("mysql://root:hunter2@h/db").unwrap();
        assert_eq!(mysql.to_string(), "mysql://root:***@h/db");
        assert!(!format!("{mysql:?}").contains("hunter2"));
    }

    /// Found by tests/properties.rs: a password with `#` (or `/`, `?`) in it, unencoded, ended
    /// the authority early and was printed whole.
    #[test]
    fn a_password_with_url_delimiters_is_hidden() {
        assert_eq!(redact("postgres://:A%A+#0@a"), "postgres://:***@a");
        assert_eq!(
            redact("mysql://u:p/w?#x@h:3306/db"),
            "mysql://u:***@h:3306/db"
        );
        // An `@` in the query hides more, never less.
        assert_eq!(
            redact("postgres://u:pw@h/db?mail=a@b"),
            "postgres://u:***@b"
        );
    }
}
