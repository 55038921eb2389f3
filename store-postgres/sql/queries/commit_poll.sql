-- commit_poll: fenced and atomic, ONE statement (one round trip) for a page that fits in
-- max_rows_per_statement rows per table.
--
-- `fence` applies the state patch with an UPDATE whose WHERE checks owner and epoch: it takes
-- the key's row lock (held to commit, so no acquisition can slip in) and re-checks the lease on
-- the latest row version. Every other part writes only `WHERE EXISTS (SELECT 1 FROM fence)`, so
-- with a stale lease nothing at all is written and the statement returns false (LeaseLost).
-- The sub-statements touch disjoint rows (the caller drops upserts of deleted identities and
-- dedupes every list by its key, last wins), because one statement may not change a row twice.
--
-- The deletes take their ids as (poller, partition, id) rows of MATERIALIZED CTEs joined on the
-- whole primary key (see ack_events.sql): one primary-key probe per id (or one scan of a table
-- the planner finds small enough), nothing for an empty list. Written
-- `poller = $1 AND "partition" = $2 AND identity = ANY($24)`, they read every item and every
-- pending event of the key on every commit of a table never ANALYZEd, even with empty lists.
--
-- A larger page runs this statement once per chunk inside one transaction: the first chunk
-- carries the patch and takes the lock, later chunks carry an empty patch and re-check the
-- fence while already holding the lock.
--
-- $1 poller, $2 partition, $3..$15 the state parameters (see save_state.sql), $16 owner,
-- $17 epoch;
-- items to upsert: $18 identity, $19 version, $20 hash, $21 schema_version, $22 payload,
--   $23 seen_at; items to delete: $24 identity;
-- pending outbox rows to insert or replace: $25 event_id, $26 seq, $27 event, $28 attempts,
--   $29 next_attempt_at, $30 last_error, $31 created_at; delivered ids to remove: $32;
-- log entries: $33 seq, $34 event, $35 created_at;
-- parked rows: $36 id, $37 kind, $38 event, $39 event_seq, $40 item, $41 error, $42 attempts,
--   $43 parked_at, $44 hold_key;
-- validators to insert or replace whole: $45 url_hash, $46 etag,
--   $47 last_modified, $48 stored_at.
WITH fence AS (
    UPDATE {pollers} AS p SET
{state_assignments}
    WHERE p.poller = $1 AND p."partition" = $2 AND p.lease_owner = $16 AND p.lease_epoch = $17
    RETURNING 1
), put_items AS (
    INSERT INTO {items} AS t
        (poller, "partition", identity, version, hash, schema_version, payload, seen_at)
    SELECT $1, $2, u.identity, u.version, u.hash, u.schema_version, u.payload::json, u.seen_at
    FROM unnest($18::text[], $19::text[], $20::text[], $21::bigint[], $22::text[], $23::bigint[])
        AS u (identity, version, hash, schema_version, payload, seen_at)
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", identity) DO UPDATE SET
        version = EXCLUDED.version,
        hash = EXCLUDED.hash,
        schema_version = EXCLUDED.schema_version,
        payload = EXCLUDED.payload,
        seen_at = EXCLUDED.seen_at
), gone_item_ids AS MATERIALIZED (
    SELECT $1::text COLLATE "C" AS poller, $2::text COLLATE "C" AS "partition",
           u.id COLLATE "C" AS identity
    FROM unnest($24::text[]) AS u (id)
), gone_items AS (
    DELETE FROM {items} AS d
    USING gone_item_ids AS g
    WHERE d.poller = g.poller AND d."partition" = g."partition" AND d.identity = g.identity
      AND EXISTS (SELECT 1 FROM fence)
), put_outbox AS (
    INSERT INTO {outbox} AS t
        (poller, "partition", event_id, seq, event, status, attempts, next_attempt_at,
         last_error, created_at)
    SELECT $1, $2, u.event_id, u.seq, u.event::json, 'pending', u.attempts, u.next_attempt_at,
           u.last_error::json, u.created_at
    FROM unnest($25::text[], $26::bigint[], $27::text[], $28::bigint[], $29::bigint[],
                $30::text[], $31::bigint[])
        AS u (event_id, seq, event, attempts, next_attempt_at, last_error, created_at)
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", event_id) DO UPDATE SET
        seq = EXCLUDED.seq,
        event = EXCLUDED.event,
        status = EXCLUDED.status,
        attempts = EXCLUDED.attempts,
        next_attempt_at = EXCLUDED.next_attempt_at,
        last_error = EXCLUDED.last_error,
        created_at = EXCLUDED.created_at
), gone_event_ids AS MATERIALIZED (
    SELECT $1::text COLLATE "C" AS poller, $2::text COLLATE "C" AS "partition",
           u.id COLLATE "C" AS event_id
    FROM unnest($32::text[]) AS u (id)
), gone_outbox AS (
    DELETE FROM {outbox} AS d
    USING gone_event_ids AS g
    WHERE d.poller = g.poller AND d."partition" = g."partition" AND d.event_id = g.event_id
      AND EXISTS (SELECT 1 FROM fence)
), put_log AS (
    INSERT INTO {log} AS t (poller, "partition", seq, event, created_at)
    SELECT $1, $2, u.seq, u.event::json, u.created_at
    FROM unnest($33::bigint[], $34::text[], $35::bigint[]) AS u (seq, event, created_at)
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", seq) DO UPDATE SET
        event = EXCLUDED.event,
        created_at = EXCLUDED.created_at
), put_parked AS (
    INSERT INTO {parked} AS t
        (poller, "partition", id, kind, event, event_seq, item, error, attempts, parked_at,
         hold_key)
    SELECT $1, $2, u.id, u.kind, u.event::json, u.event_seq, u.item::json, u.error::json,
           u.attempts, u.parked_at, u.hold_key
    FROM unnest($36::text[], $37::text[], $38::text[], $39::bigint[], $40::text[], $41::text[],
                $42::bigint[], $43::bigint[], $44::text[])
        AS u (id, kind, event, event_seq, item, error, attempts, parked_at, hold_key)
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", id) DO UPDATE SET
        kind = EXCLUDED.kind,
        event = EXCLUDED.event,
        event_seq = EXCLUDED.event_seq,
        item = EXCLUDED.item,
        error = EXCLUDED.error,
        attempts = EXCLUDED.attempts,
        parked_at = EXCLUDED.parked_at,
        hold_key = EXCLUDED.hold_key
), put_validators AS (
    INSERT INTO {validators} AS t (poller, "partition", url_hash, etag, last_modified, stored_at)
    SELECT $1, $2, u.url_hash, u.etag, u.last_modified, u.stored_at
    FROM unnest($45::text[], $46::text[], $47::text[], $48::bigint[])
        AS u (url_hash, etag, last_modified, stored_at)
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", url_hash) DO UPDATE SET
        etag = EXCLUDED.etag,
        last_modified = EXCLUDED.last_modified,
        stored_at = EXCLUDED.stored_at
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced
