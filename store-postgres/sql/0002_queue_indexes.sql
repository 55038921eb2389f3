-- watukuy PostgreSQL store, migration 2: indexes shaped for the queries that use them, so no
-- lookup by id can be planned as a scan of a key's rows.
--
-- Placeholders and idempotency as in 0001_init.sql: running the text again changes nothing.
-- Both statements run inside the migration transaction, so a large outbox is locked against
-- writes while its index is built (the outbox only holds pending events, usually few).

-- The dispatcher's queue: load_pending (key, status = 'pending', ORDER BY seq, event_id LIMIT n)
-- reads it in order and stops after n entries; count_pending counts it. It replaces
-- outbox_pending_idx (poller, partition, status, seq, event_id), whose leading columns are the
-- primary key's: on an outbox never ANALYZEd, the planner ran the ack's
-- `event_id = ANY(...)` through it as a filter over every pending row of the key (17 ms per ack
-- at 20,000 pending rows). A partial index is usable only by statements that say
-- `status = 'pending'`, which no lookup by event id does.
CREATE INDEX IF NOT EXISTS "{prefix}outbox_queue_idx"
    ON "{schema}"."{prefix}outbox" (poller, "partition", seq, event_id)
    WHERE status = 'pending';
DROP INDEX IF EXISTS "{schema}"."{prefix}outbox_pending_idx";

-- held_keys (every drain pass): the distinct hold keys of a key's parked rows, read in order
-- from the held rows only, however many parked rows without a hold key (quarantined items) the
-- key has.
CREATE INDEX IF NOT EXISTS "{prefix}parked_hold_idx"
    ON "{schema}"."{prefix}parked" (poller, "partition", hold_key)
    WHERE hold_key IS NOT NULL;
