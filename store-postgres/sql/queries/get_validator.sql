-- get_validator. $1 poller, $2 partition, $3 url hash.
SELECT etag, last_modified, stored_at
FROM {validators}
WHERE poller = $1 AND "partition" = $2 AND url_hash = $3
