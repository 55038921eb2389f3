-- load_versions: present rows of the given identities. $1 poller, $2 partition, $3 identities.
--
-- One primary-key probe per identity, whatever the table's size and statistics: the LATERAL
-- subquery (kept apart by its LIMIT) is planned for one identity at a time, an equality on all
-- three primary-key columns. Written `poller = $1 AND "partition" = $2 AND identity = ANY($3)`,
-- PostgreSQL 15 may read the key's whole primary-key range and filter the identities (its guess
-- on a table never ANALYZEd is that a key has almost no rows): every page of a first backfill
-- then read every item of the key stored so far. An identity listed twice comes back twice;
-- the caller keeps one.
SELECT i.identity, i.version, i.hash, i.schema_version, i.payload::text AS payload, i.seen_at
FROM unnest($3::text[]) AS u (id)
CROSS JOIN LATERAL (
    SELECT x.identity, x.version, x.hash, x.schema_version, x.payload, x.seen_at
    FROM {items} AS x
    WHERE x.poller = $1 AND x."partition" = $2 AND x.identity = u.id COLLATE "C"
    LIMIT 1
) AS i
