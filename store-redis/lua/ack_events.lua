-- Fenced: removes delivered outbox rows; unknown ids are ignored.
-- KEYS: meta, outbox, rows, attempts, errors. ARGV: owner, epoch, then the event ids.
local wrong = check_types(KEYS, 'hash', 'zset', 'hash', 'hash', 'hash')
if wrong then return wrong end
if not holds(KEYS[1], ARGV[1], ARGV[2]) then
  return 'LEASE_LOST'
end
for i = 3, #ARGV do
  remove_outbox(KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[i])
end
return 'OK'
