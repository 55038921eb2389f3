-- Unfenced: moves poison rows back to the outbox as pending rows built by the caller from the
-- parked rows it read. A row moves only if it is still exactly the row the caller read.
-- KEYS: parked, hold, outbox, rows, attempts, errors.
-- ARGV: for each row: id, parked row JSON as read, sequence, new outbox row JSON.
-- Returns the number moved, then the ids whose parked row changed since it was read.
local wrong = check_types(KEYS, 'hash', 'hash', 'zset', 'hash', 'hash', 'hash')
if wrong then return wrong end
local moved = 0
local changed = {}
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  local current = redis.call('HGET', KEYS[1], id)
  if current == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    put_outbox(KEYS[3], KEYS[4], KEYS[5], KEYS[6], id, ARGV[i + 2], ARGV[i + 3])
    moved = moved + 1
  elseif current then
    table.insert(changed, id)
  end
end
table.insert(changed, 1, moved)
return changed
