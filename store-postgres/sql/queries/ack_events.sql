-- ack_events: fenced, ONE statement. `fence` locks the key's row only if owner and epoch match
-- (FOR UPDATE re-checks them on the latest row version after any wait); the delete runs only
-- when it matched, and the statement says whether it did.
-- $1 poller, $2 partition, $3 owner, $4 epoch, $5 event ids.
WITH fence AS (
    SELECT 1 FROM {pollers}
    WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
    FOR UPDATE
), gone AS (
    DELETE FROM {outbox}
    WHERE poller = $1 AND "partition" = $2 AND event_id = ANY($5::text[])
      AND EXISTS (SELECT 1 FROM fence)
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced
