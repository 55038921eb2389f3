-- prune_log: entries created strictly before the cutoff. $1 poller, $2 partition, $3 cutoff.
DELETE FROM {log} WHERE poller = $1 AND "partition" = $2 AND created_at < $3
