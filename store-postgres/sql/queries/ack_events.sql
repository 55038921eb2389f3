-- ack_events: fenced, ONE statement. `fence` locks the key's row only if owner and epoch match
-- (FOR UPDATE re-checks them on the latest row version after any wait); the delete runs only
-- when it matched, and the statement says whether it did.
--
-- The ids arrive as (poller, partition, event_id) rows of a MATERIALIZED CTE joined on the whole
-- primary key, not as `poller = $1 AND "partition" = $2 AND event_id = ANY($5)`. Given the key
-- as constants, PostgreSQL 15 may read the key's whole index range (of any index that starts
-- with poller, partition: the primary key itself is one) and filter event_id, a plan it thinks
-- cheap on a table never ANALYZEd, where it guesses that a key has almost no rows: 17 ms per
-- ack at 20,000 pending rows. Here the outbox has no constant condition of its own, so its
-- plans are one primary-key probe per id or, where the planner finds the table small enough
-- for it (by its real size, not by a guess), one scan of the table hashed against the ids.
-- tests/plans.rs checks the plan.
-- $1 poller, $2 partition, $3 owner, $4 epoch, $5 event ids.
WITH fence AS (
    SELECT 1 FROM {pollers}
    WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
    FOR UPDATE
), ids AS MATERIALIZED (
    SELECT $1::text COLLATE "C" AS poller, $2::text COLLATE "C" AS "partition",
           u.id COLLATE "C" AS event_id
    FROM unnest($5::text[]) AS u (id)
), gone AS (
    DELETE FROM {outbox} AS o
    USING ids
    WHERE o.poller = ids.poller AND o."partition" = ids."partition"
      AND o.event_id = ids.event_id
      AND EXISTS (SELECT 1 FROM fence)
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced
