-- apply_once: the marker of $1 exists; reads, in a statement that starts after any concurrent
-- claim of the id ended (so it sees that claim's commit), whether the marker is still there
-- (prune may have removed it since) and its subject's last applied event, locking that row
-- until the transaction ends: a concurrent claim that re-applies the id waits here, then reads
-- the row as that claim left it (READ COMMITTED re-reads a locked row's newest version).
-- $1 event id, $2 poller, $3 partition, $4 subject.
WITH last AS (
    SELECT event_id, "type", sequence FROM "{schema}"."{table}_subjects"
    WHERE poller = $2 AND "partition" = $3 AND subject = $4
    FOR UPDATE
)
SELECT EXISTS (SELECT 1 FROM "{schema}"."{table}" WHERE event_id = $1) AS marked,
       last.event_id, last."type", last.sequence
FROM (SELECT 1) AS one
LEFT JOIN last ON true
