-- Up to `limit` pending rows in sequence order (ties by id), with the attempts and last error
-- recorded beside each, in one atomic read.
-- KEYS: outbox, rows, attempts, errors. ARGV: the last rank to read (limit - 1, as decimal text).
-- Returns id, row, attempts (or nil), error (or nil) for each row.
local out = {}
local ids = redis.call('ZRANGE', KEYS[1], 0, ARGV[1])
for _, id in ipairs(ids) do
  local row = redis.call('HGET', KEYS[2], id)
  if row then
    table.insert(out, id)
    table.insert(out, row)
    table.insert(out, redis.call('HGET', KEYS[3], id))
    table.insert(out, redis.call('HGET', KEYS[4], id))
  end
end
return out
