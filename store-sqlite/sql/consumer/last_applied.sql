-- claim: the id has a marker; the last event applied for its subject (id, type, sequence), which
-- tells a redelivery from an id that came back as a new change (watukuy_core::delivery::
-- reapplies). No row when the subject has none (pruned, or a marker older than migration 2).
-- ?1 poller, ?2 partition, ?3 subject.
SELECT event_id, "type", sequence FROM {table}_last
WHERE poller = ?1 AND "partition" = ?2 AND subject = ?3
