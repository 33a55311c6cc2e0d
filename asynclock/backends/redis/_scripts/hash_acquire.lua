-- The hash lock's acquire (Redis Cluster, Redlock's nodes): take the lock if
-- nobody has it, or re-enter it for the same hold id (so a retry is idempotent).
--
-- KEYS[1] the lock hash (fields owner, count, token), KEYS[2] its fence counter
-- ARGV[1] hold id, ARGV[2] ttl in ms, ARGV[3] fence counter lifetime in ms
-- returns {1, token} if ARGV[1] holds it now (taken, or held already: its ttl
-- is reset), {0, pttl of the lock} if another hold has it
--
-- A new token is max(last token + 1, server time in us): see _hash.py.

local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  local token = string.format('%.0f', math.max(last + 1, now))
  redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('HGET', KEYS[1], 'token')}
end
return {0, redis.call('PTTL', KEYS[1])}
