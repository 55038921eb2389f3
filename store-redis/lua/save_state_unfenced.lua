-- Unfenced state patch (pause, resume, trigger, reset, partition removal): never reads or
-- touches the lease.
-- KEYS: state. ARGV: the state arguments of write_state.
write_state(KEYS[1], ARGV, 1)
return 'OK'
