//! Table names, the byte limits of the indexed columns, and multi-row statements cut into
//! chunks of a few fixed shapes.

use sqlx::mysql::{MySql, MySqlArguments};
use sqlx::query::Query;
use sqlx::{Executor, MySqlConnection};
use watukuy_core::{
    Error, Result,
    store::{PKey, StoreErrorKind},
};

use crate::error::OrStore;

/// The store's tables, quoted, for SQL text.
#[derive(Clone, Debug)]
pub(crate) struct Tables {
    /// The prefix, unquoted (for messages and the lock name).
    pub(crate) prefix: String,
    pub(crate) keys: String,
    pub(crate) items: String,
    pub(crate) outbox: String,
    pub(crate) parked: String,
    pub(crate) validators: String,
    pub(crate) log: String,
    pub(crate) schema_version: String,
}

impl Tables {
    /// The tables of `prefix` (already checked: letters, digits and `_`).
    pub(crate) fn new(prefix: &str) -> Self {
        let quoted = |name: &str| format!("`{prefix}{name}`");
        Self {
            prefix: prefix.to_owned(),
            keys: quoted("keys"),
            items: quoted("items"),
            outbox: quoted("outbox"),
            parked: quoted("parked"),
            validators: quoted("validators"),
            log: quoted("log"),
            schema_version: quoted("schema_version"),
        }
    }
}

/// The longest table prefix: MySQL names are at most 64 characters, and the longest table is
/// `<prefix>schema_version`.
pub(crate) const MAX_PREFIX: usize = 48;

/// Byte limits of the indexed (VARBINARY) columns: the primary keys must fit InnoDB's 3072-byte
/// index limit.
pub(crate) mod limit {
    /// Poller names, partitions, lease owners, event ids, parked ids and URL hashes.
    pub(crate) const NAME: usize = 255;
    /// Item identities.
    pub(crate) const IDENTITY: usize = 1024;
}

/// Fails with a `Rejected` error naming `what` when `value` is longer than `max` bytes.
pub(crate) fn check_len(what: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        let head: String = value.chars().take(40).collect();
        return Err(Error::store(
            StoreErrorKind::Rejected,
            false,
            format!(
                "{what} {head:?}… is {} bytes long; the MySQL store keeps at most {max}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Rows in one multi-row statement, at most (a power of two).
pub(crate) const MAX_ROWS: usize = 256;
/// Parameter bytes in one statement before padding, at most (a lone larger row goes alone).
/// Padding at most doubles it, which stays under MariaDB's default `max_allowed_packet` (16 MiB).
pub(crate) const MAX_BYTES: usize = 4 << 20;

/// A query with its arguments.
pub(crate) type MyQuery<'q> = Query<'q, MySql, MySqlArguments>;

/// Cuts `rows` into chunks of at most [`MAX_ROWS`] rows and about [`MAX_BYTES`] bytes.
pub(crate) fn chunks<R>(rows: &[R], size: impl Fn(&R) -> usize) -> Vec<&[R]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, row) in rows.iter().enumerate() {
        let len = size(row);
        // `start <= i < len` throughout: both slices are in range.
        if i > start && (i - start == MAX_ROWS || bytes + len > MAX_BYTES) {
            out.push(&rows[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += len;
    }
    if start < rows.len() {
        out.push(&rows[start..]);
    }
    out
}

/// How many rows a chunk of `n` is padded to: the next power of two, so a table sees at most
/// nine statement shapes (1, 2, 4 … 256 rows) and the server keeps few prepared statements.
pub(crate) fn padded(n: usize) -> usize {
    n.next_power_of_two().min(MAX_ROWS.max(n))
}

/// `chunk`, then its first row again until there are `n` rows: the arguments of a statement
/// prepared for [`padded`]`(chunk.len())` rows (a repeated id changes nothing in `IN (…)`).
pub(crate) fn padded_rows<T>(chunk: &[T], n: usize) -> impl Iterator<Item = &T> {
    let repeat = n.saturating_sub(chunk.len());
    chunk
        .iter()
        .chain(chunk.first().into_iter().cycle().take(repeat))
}

/// `n` comma-separated groups of `width` placeholders: `(?,?),(?,?)`.
pub(crate) fn tuples(n: usize, width: usize) -> String {
    let one = format!("({})", vec!["?"; width].join(","));
    vec![one; n].join(",")
}

/// `n` comma-separated placeholders.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(",")
}

/// Runs `head` + `VALUES (..),(..)` for every chunk of `rows`, `width` placeholders a row (the
/// key's poller and partition, then what `bind` binds), each
/// chunk padded to a power of two by repeating its smallest row (`REPLACE` of the same row twice
/// and `IN` lists with a repeated id are harmless).
pub(crate) async fn write_rows<R: Sync>(
    conn: &mut MySqlConnection,
    (head, width): (&str, usize),
    key: &PKey,
    rows: &[R],
    size: impl Fn(&R) -> usize + Send + Sync,
    bind: impl for<'q> Fn(MyQuery<'q>, &'q R) -> MyQuery<'q> + Send + Sync,
    doing: &str,
) -> Result<()> {
    for chunk in chunks(rows, &size) {
        let n = padded(chunk.len());
        let sql = format!("{head} VALUES {}", tuples(n, width));
        let mut query = sqlx::query(&sql);
        let smallest = chunk.iter().min_by_key(|r| size(r));
        let padding = smallest.into_iter().cycle().take(n - chunk.len());
        for row in chunk.iter().chain(padding) {
            query = bind(
                query
                    .bind(key.poller.as_bytes())
                    .bind(key.partition.as_bytes()),
                row,
            );
        }
        conn.execute(query).await.store(doing)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_rows_and_bytes() {
        let rows: Vec<usize> = vec![1; 600];
        let sizes: Vec<usize> = chunks(&rows, |r| *r).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![256, 256, 88]);
        let big = vec![MAX_BYTES / 2 + 1; 3];
        assert_eq!(chunks(&big, |r| *r).len(), 3);
        let huge = vec![MAX_BYTES * 2];
        assert_eq!(chunks(&huge, |r| *r).len(), 1);
        assert!(chunks(&Vec::<usize>::new(), |r| *r).is_empty());
    }

    #[test]
    fn padding_is_a_power_of_two() {
        assert_eq!(padded(1), 1);
        assert_eq!(padded(3), 4);
        assert_eq!(padded(129), 256);
        assert_eq!(padded(256), 256);
        assert_eq!(tuples(2, 2), "(?,?),(?,?)");
        assert_eq!(marks(3), "?,?,?");
    }

    #[test]
    fn long_names_are_rejected_by_name() {
        let err = check_len("identity", &"x".repeat(2000), limit::IDENTITY).unwrap_err();
        assert!(err.to_string().contains("identity"));
        assert!(err.to_string().contains("2000 bytes"));
        assert!(check_len("identity", "abc", limit::IDENTITY).is_ok());
    }
}
