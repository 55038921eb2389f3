-- load_versions: present rows of the given identities. $1 poller, $2 partition, $3 identities.
SELECT identity, version, hash, schema_version, payload::text AS payload, seen_at
FROM {items}
WHERE poller = $1 AND "partition" = $2 AND identity = ANY($3::text[])
