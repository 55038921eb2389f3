-- Migration 1: the six tables of the store. Every statement is idempotent, so running the file
-- again (or running the exported DDL by hand first) changes nothing.

-- One row per (poller, partition): its state (PollerState as JSON text), its lease and its epoch
-- counter. The row outlives delete_key (present = 0, everything else cleared) so that the epoch
-- counter never restarts: a lease taken before a delete can never pass the fence afterwards.
CREATE TABLE IF NOT EXISTS {prefix}pollers (
    poller           TEXT    NOT NULL,
    "partition"      TEXT    NOT NULL,
    present          INTEGER NOT NULL DEFAULT 1,
    state            TEXT,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    epoch_counter    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (poller, "partition")
);

-- The item snapshot. payload is SQL NULL when absent and the JSON text (possibly `null`) when
-- stored, byte for byte.
CREATE TABLE IF NOT EXISTS {prefix}items (
    poller         TEXT    NOT NULL,
    "partition"    TEXT    NOT NULL,
    identity       TEXT    NOT NULL,
    version        TEXT,
    hash           TEXT    NOT NULL,
    schema_version INTEGER NOT NULL,
    payload        TEXT,
    seen_at        INTEGER NOT NULL,
    PRIMARY KEY (poller, "partition", identity)
);

-- The outbox holds pending rows only: a row committed as delivered, or acknowledged, is deleted.
CREATE TABLE IF NOT EXISTS {prefix}outbox (
    poller          TEXT    NOT NULL,
    "partition"     TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    event           TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (poller, "partition", event_id)
);
CREATE INDEX IF NOT EXISTS {prefix}outbox_pending_idx
    ON {prefix}outbox (poller, "partition", seq, event_id);

-- Parked events (kind 'poison') and quarantined items (kind 'invalid').
CREATE TABLE IF NOT EXISTS {prefix}parked (
    poller      TEXT    NOT NULL,
    "partition" TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    event       TEXT,
    item        TEXT,
    error       TEXT    NOT NULL,
    attempts    INTEGER NOT NULL,
    parked_at   INTEGER NOT NULL,
    hold_key    TEXT,
    PRIMARY KEY (poller, "partition", id)
);
CREATE INDEX IF NOT EXISTS {prefix}parked_order_idx
    ON {prefix}parked (poller, "partition", parked_at, id);

-- HTTP validators per URL hash.
CREATE TABLE IF NOT EXISTS {prefix}validators (
    poller        TEXT    NOT NULL,
    "partition"   TEXT    NOT NULL,
    url_hash      TEXT    NOT NULL,
    etag          TEXT,
    last_modified TEXT,
    stored_at     INTEGER NOT NULL,
    PRIMARY KEY (poller, "partition", url_hash)
);

-- The replay log, keyed by outbox sequence.
CREATE TABLE IF NOT EXISTS {prefix}log (
    poller      TEXT    NOT NULL,
    "partition" TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    event       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (poller, "partition", seq)
);
CREATE INDEX IF NOT EXISTS {prefix}log_time_idx
    ON {prefix}log (poller, "partition", created_at);
