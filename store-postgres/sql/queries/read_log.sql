-- read_log: sequence order. $1 poller, $2 partition, $3 after_sequence or NULL, $4 from_time or
-- NULL, $5 to_time or NULL (both inclusive), $6 limit.
SELECT seq, event::text AS event, created_at
FROM {log}
WHERE poller = $1 AND "partition" = $2
  AND ($3::bigint IS NULL OR seq > $3)
  AND ($4::bigint IS NULL OR created_at >= $4)
  AND ($5::bigint IS NULL OR created_at <= $5)
ORDER BY seq
LIMIT $6
