-- Fenced: inserts or replaces a parked row and removes the outbox row of its event, if any.
-- KEYS: meta, outbox, rows, attempts, errors, parked, hold.
-- ARGV: owner, epoch, id, row JSON, has hold ('1' or '0'), hold key, has event ('1' or '0'),
--       event id.
local wrong = check_types(KEYS, 'hash', 'zset', 'hash', 'hash', 'hash', 'hash', 'hash')
if wrong then return wrong end
if not holds(KEYS[1], ARGV[1], ARGV[2]) then
  return 'LEASE_LOST'
end
if ARGV[7] == '1' then
  remove_outbox(KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[8])
end
put_parked(KEYS[6], KEYS[7], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return 'OK'
