-- list_keys: keys created by a lease or a save and not deleted since. $1 poller or NULL.
SELECT poller, "partition"
FROM {pollers}
WHERE listed AND ($1::text IS NULL OR poller = $1)
ORDER BY poller, "partition"
