-- The queued resource's release: give up a hold, or leave the queue.
--
-- KEYS[1..5] holds, data, queue, waiting, fence
-- ARGV[1] hold id, ARGV[2] permits (a semaphore's holders' own number wins),
-- ARGV[3] fence counter lifetime in ms
-- returns {1} released, {0} not a holder (its queue entry, if any, is gone);
-- whatever it frees is handed to the queue's head

local hold = ARGV[1]
local permits = tonumber(redis.call('HGET', D, '#permits') or ARGV[2])
prune()
local out = {0}
if redis.call('ZREM', H, hold) == 1 then
  redis.call('HDEL', D, hold)
  out = {1}
elseif redis.call('HDEL', W, hold) == 1 then
  redis.call('LREM', Q, 0, hold)
end
if serve(permits, ARGV[3]) == nil and redis.call('ZCARD', H) == 0 then
  redis.call('DEL', H, D, Q, W)
end
return out
