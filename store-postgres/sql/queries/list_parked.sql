-- list_parked: by parked_at then id (byte order). $1 poller, $2 partition, $3 kind or NULL,
-- $4 limit or NULL (no limit).
SELECT id, kind, event::text AS event, item::text AS item, error::text AS error, attempts,
       parked_at, hold_key
FROM {parked}
WHERE poller = $1 AND "partition" = $2 AND ($3::text IS NULL OR kind = $3)
ORDER BY parked_at, id
LIMIT $4
