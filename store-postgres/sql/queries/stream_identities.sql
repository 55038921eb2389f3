-- stream_identities: one keyset page in byte order. $1 poller, $2 partition, $3 the last
-- identity of the previous page or NULL, $4 page size.
--
-- Byte order is the Store contract (stream_identities point 2): comparison and sort are in the
-- "C" collation, spelled out although the column is declared COLLATE "C", so the order never
-- depends on the database's default collation. Being the column's own collation, they are
-- served by the primary key's index (poller, "partition", identity). The keyset bound is
-- written `identity >= COALESCE($3, '') AND identity IS DISTINCT FROM $3` (that is
-- `identity > $3`, or everything on the first page, the empty identity included) rather than
-- `$3 IS NULL OR identity > $3`, because that OR keeps the bound out of the index condition of
-- a generic (prepared) plan: every page would then rescan the key's rows from the first.
SELECT identity
FROM {items}
WHERE poller = $1 AND "partition" = $2
  AND identity COLLATE "C" >= COALESCE($3::text, '') COLLATE "C"
  AND identity IS DISTINCT FROM $3::text
ORDER BY identity COLLATE "C"
LIMIT $4
