-- discard_parked: rows removed (an id listed twice removes one row). $1 poller, $2 partition,
-- $3 ids.
DELETE FROM {parked} WHERE poller = $1 AND "partition" = $2 AND id = ANY($3::text[])
