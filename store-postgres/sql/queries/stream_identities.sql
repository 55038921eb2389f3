-- stream_identities: one keyset page in byte order. $1 poller, $2 partition, $3 the last
-- identity of the previous page or NULL, $4 page size.
SELECT identity
FROM {items}
WHERE poller = $1 AND "partition" = $2 AND ($3::text IS NULL OR identity > $3)
ORDER BY identity
LIMIT $4
