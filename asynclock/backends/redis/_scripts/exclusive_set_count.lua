-- The exclusive lock's hold count (kept for info() and tools).
--
-- KEYS[1] X, KEYS[2] Q
-- ARGV[1] hold id, ARGV[2] hold count, ARGV[3] ttl in ms
-- returns 1 if ARGV[1] holds it (count recorded, expiry reset), 0 otherwise (no change)

local v = redis.call('GET', X)
if v then
  local tok, _, flag, _, holder = parse(v)
  if holder == ARGV[1] then
    hold_x(tonumber(tok), ARGV[2], flag, holder, tonumber(ARGV[3]))
    return 1
  end
end
return 0
