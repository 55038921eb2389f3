-- discard_parked: rows removed (an id listed twice removes one row). $1 poller, $2 partition,
-- $3 ids. The ids are joined on the whole primary key (see ack_events.sql).
WITH ids AS MATERIALIZED (
    SELECT $1::text COLLATE "C" AS poller, $2::text COLLATE "C" AS "partition",
           u.id COLLATE "C" AS id
    FROM unnest($3::text[]) AS u (id)
)
DELETE FROM {parked} AS p
USING ids
WHERE p.poller = ids.poller AND p."partition" = ids."partition" AND p.id = ids.id
