-- Up to `limit` pending rows in sequence order (ties by id), with the attempts and last error
-- recorded beside each, in one atomic read; with a fifth key, the hold keys too.
-- KEYS: outbox, rows, attempts, errors[, hold]. ARGV: the last rank to read (limit - 1, as
-- decimal text; -1 reads no row).
-- Returns, with the hold hash: how many hold values follow (decimal text), then those values
-- (repeats included). Then id, row, attempts (or nil), error (or nil) for each row.
local out = {}
if KEYS[5] then
  local held = redis.call('HVALS', KEYS[5])
  table.insert(out, tostring(#held))
  for _, value in ipairs(held) do
    table.insert(out, value)
  end
end
if tonumber(ARGV[1]) >= 0 then
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
end
return out
