-- load_pending_with_holds: the rows of load_pending and the keys of held_keys in one statement.
-- $1 poller, $2 partition, $3 limit. At least one row: the hold keys (as an array, on every row)
-- beside the pending rows of load_pending.sql (spliced in below by the store), whose columns are
-- all NULL on the one row when none is pending. Each part reads the same partial index as its
-- own query; no sort: the store orders the (at most $3) rows by seq, then event_id ("C"
-- collation: byte order) itself.
WITH held AS (
    SELECT coalesce(array_agg(DISTINCT hold_key), '{}') AS held_keys
    FROM {parked}
    WHERE poller = $1 AND "partition" = $2 AND hold_key IS NOT NULL
)
SELECT held.held_keys, pending.*
FROM held
LEFT JOIN LATERAL (
{load_pending}
) AS pending ON true
