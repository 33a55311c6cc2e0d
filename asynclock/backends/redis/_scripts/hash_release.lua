-- The hash lock's release, announced to every subscriber of the lock's channel
-- (on a Cluster with SPUBLISH: a script may only publish on a shard channel of
-- its own slot, which the channel's hash tag makes the lock's).
--
-- KEYS[1] the lock hash, KEYS[2] its release channel (same hash tag)
-- ARGV[1] hold id
-- returns 1 if released (and one message, the hold id, published), 0 if
-- ARGV[1] did not hold it (no change)

if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], ARGV[1])
  return 1
end
return 0
