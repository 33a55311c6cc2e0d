-- The hash lock's hold count (kept for info() and tools).
--
-- KEYS[1] the lock hash
-- ARGV[1] hold id, ARGV[2] hold count, ARGV[3] ttl in ms
-- returns 1 if ARGV[1] holds it (count recorded, ttl reset), 0 otherwise (no change)

if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'count', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
