-- Unfenced: removes everything of a key but its epoch counter, so a lease taken before the
-- delete never passes the fence of the key when it comes back.
-- KEYS: meta, then every other key of the (poller, partition).
redis.call('HDEL', KEYS[1], 'owner', 'epoch', 'expires_at')
for i = 2, #KEYS do
  redis.call('DEL', KEYS[i])
end
return 'OK'
