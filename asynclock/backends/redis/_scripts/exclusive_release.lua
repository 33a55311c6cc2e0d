-- The exclusive lock's release: give it up (handing it to the head of the
-- queue), or leave the queue.
--
-- KEYS[1] X, KEYS[2] Q
-- ARGV[1] hold id, ARGV[2] how long a free lock keeps its last token, in ms,
-- ARGV[3] the hold's token ('' if unknown), ARGV[4] its queue entry as last
-- answered ('' if none), ARGV[5] an election's channel, told X's value
-- whenever this call changes who holds X ('' or absent: a lock)
-- returns 1 released, 0 not the holder (its queue entry, if any, is gone)
--
-- With the token known, one SET ... GET both frees the lock and reads what it
-- held; if that was not this hold, the old value is put back as it was (its
-- expiry is in the value).

local hold, keep = ARGV[1], ARGV[2]
E = ARGV[5] or ''
local v
if ARGV[3] ~= '' then
  v = redis.call('SET', X, ARGV[3], 'PX', keep, 'GET')
else
  v = redis.call('GET', X)
end
local tok, count, flag, exp, holder
if v then tok, count, flag, exp, holder = parse(v) end
if holder == hold then
  if flag == 'q' then
    local got, t = serve(tonumber(tok), nil)
    if not got then redis.call('SET', X, num(t), 'PX', keep) end
  elseif ARGV[3] ~= tok then
    redis.call('SET', X, tok, 'PX', keep)
  end
  announce()
  return 1
end
if ARGV[3] ~= '' then -- put back what the SET replaced
  if not v then
    redis.call('DEL', X)
  elseif holder then
    redis.call('SET', X, v, 'PXAT', exp)
  else
    redis.call('SET', X, v, 'PX', keep)
  end
end
local at, entry = find(hold, ARGV[4])
if at then
  redis.call('LREM', Q, 1, entry)
  if not holder and redis.call('EXISTS', Q) == 1 then
    -- no live holder while others are queued: the next in line goes now
    local got, t = serve(v and tonumber(v), nil)
    if got then
      announce()
    elseif t then
      redis.call('SET', X, num(t), 'PX', keep)
    end
  end
end
return 0
