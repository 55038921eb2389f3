-- set_validator: fenced, ONE statement (fence as in ack_events.sql).
-- $1 poller, $2 partition, $3 owner, $4 epoch, $5 url hash, $6 etag, $7 last_modified,
-- $8 stored_at.
WITH fence AS (
    SELECT 1 FROM {pollers}
    WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
    FOR UPDATE
), put AS (
    INSERT INTO {validators} (poller, "partition", url_hash, etag, last_modified, stored_at)
    SELECT $1, $2, $5, $6, $7, $8
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", url_hash) DO UPDATE SET
        etag = EXCLUDED.etag,
        last_modified = EXCLUDED.last_modified,
        stored_at = EXCLUDED.stored_at
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced
