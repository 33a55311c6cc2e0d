-- Who holds an exclusive lock (an election's leader), in one read.
--
-- KEYS[1] X
-- returns {holder, token, ms until its hold expires} while held, else false

local v = redis.call('GET', KEYS[1])
if not v then return false end
local tok, holder = string.match(v, '^(%d+) %d+ %S %d+ (.*)$')
if not holder then return false end
return {holder, tok, redis.call('PTTL', KEYS[1])}
