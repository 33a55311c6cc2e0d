-- What the hash lock holds.
--
-- KEYS[1] the lock hash
-- returns {owner or false, count, token, pttl}

local v = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token')
return {v[1], v[2], v[3], redis.call('PTTL', KEYS[1])}
