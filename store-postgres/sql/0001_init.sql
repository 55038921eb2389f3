-- watukuy PostgreSQL store, migration 1: the six tables of the store.
--
-- {schema} and {prefix} are replaced by the validated, double-quoted identifiers of the store's
-- options before this runs; nothing else is ever interpolated. Every statement is idempotent
-- (IF NOT EXISTS), so running the text again changes nothing.
--
-- Types: epoch milliseconds, sequences and epochs are bigint; key columns use the "C" collation
-- so ordering (list_parked ties, load_pending ties, stream_identities keysets) is byte order,
-- exactly like the reference store. Payload-bearing columns are `json`, not `jsonb`: `json`
-- validates the text and keeps it verbatim (key order, whitespace, number spelling, escapes,
-- big integers), which the store contract requires byte for byte; `jsonb` would normalise it.

-- One row per key: its state, its lease and the epoch counter.
--
-- The state is kept one column per top-level field of PollerState, so a patch (which replaces
-- top-level fields) is a plain column update inside the fencing statement itself: no JSON is
-- processed in SQL (PostgreSQL's JSON functions reject the \u0000 escape that plain `json` keeps).
-- `has_state` is false until the first save; `listed` is false after delete_key: the row then
-- stays only to keep the epoch counter, so a key that comes back never reuses an epoch.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}pollers" (
    poller           text COLLATE "C" NOT NULL,
    "partition"      text COLLATE "C" NOT NULL,
    listed           boolean NOT NULL DEFAULT true,
    has_state        boolean NOT NULL DEFAULT false,
    lanes            json,
    schedule         json,
    paused           boolean,
    schema_version   bigint,
    sequence         bigint,
    created_at       bigint,
    updated_at       bigint,
    lease_owner      text,
    lease_epoch      bigint NOT NULL DEFAULT 0,
    lease_expires_at bigint,
    epoch_counter    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (poller, "partition")
);

-- The item snapshot. A NULL payload means "not stored"; the JSON text `null` is a stored null.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}items" (
    poller         text COLLATE "C" NOT NULL,
    "partition"    text COLLATE "C" NOT NULL,
    identity       text COLLATE "C" NOT NULL,
    version        text,
    hash           text NOT NULL,
    schema_version bigint NOT NULL,
    payload        json,
    seen_at        bigint NOT NULL,
    PRIMARY KEY (poller, "partition", identity)
);

-- The outbox. Delivered rows are deleted, so every stored row is pending.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}outbox" (
    poller          text COLLATE "C" NOT NULL,
    "partition"     text COLLATE "C" NOT NULL,
    event_id        text COLLATE "C" NOT NULL,
    seq             bigint NOT NULL,
    event           json NOT NULL,
    status          text NOT NULL DEFAULT 'pending',
    attempts        bigint NOT NULL DEFAULT 0,
    next_attempt_at bigint,
    last_error      json,
    created_at      bigint NOT NULL,
    PRIMARY KEY (poller, "partition", event_id)
);
CREATE INDEX IF NOT EXISTS "{prefix}outbox_pending_idx"
    ON "{schema}"."{prefix}outbox" (poller, "partition", status, seq, event_id);

-- Parked rows: poison events and quarantined (invalid) items. `event_seq` copies the event's
-- sequence so retry_parked never has to parse the stored JSON.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}parked" (
    poller      text COLLATE "C" NOT NULL,
    "partition" text COLLATE "C" NOT NULL,
    id          text COLLATE "C" NOT NULL,
    kind        text NOT NULL,
    event       json,
    event_seq   bigint,
    item        json,
    error       json NOT NULL,
    attempts    bigint NOT NULL,
    parked_at   bigint NOT NULL,
    hold_key    text COLLATE "C",
    PRIMARY KEY (poller, "partition", id)
);
CREATE INDEX IF NOT EXISTS "{prefix}parked_order_idx"
    ON "{schema}"."{prefix}parked" (poller, "partition", parked_at, id);

-- HTTP validators per URL hash.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}validators" (
    poller        text COLLATE "C" NOT NULL,
    "partition"   text COLLATE "C" NOT NULL,
    url_hash      text COLLATE "C" NOT NULL,
    etag          text,
    last_modified text,
    stored_at     bigint NOT NULL,
    PRIMARY KEY (poller, "partition", url_hash)
);

-- The replay log, keyed by sequence.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}log" (
    poller      text COLLATE "C" NOT NULL,
    "partition" text COLLATE "C" NOT NULL,
    seq         bigint NOT NULL,
    event       json NOT NULL,
    created_at  bigint NOT NULL,
    PRIMARY KEY (poller, "partition", seq)
);
CREATE INDEX IF NOT EXISTS "{prefix}log_time_idx"
    ON "{schema}"."{prefix}log" (poller, "partition", created_at);
