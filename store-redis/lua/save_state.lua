-- Fenced state patch.
-- KEYS: meta, state. ARGV: owner, epoch, then the state arguments of write_state.
if not holds(KEYS[1], ARGV[1], ARGV[2]) then
  return 'LEASE_LOST'
end
write_state(KEYS[2], ARGV, 3)
return 'OK'
