-- The exclusive lock's acquire of several locks together (a multi-lock): all or none.
--
-- KEYS: X and Q of each lock, in pairs (KEYS[2i-1] X, KEYS[2i] Q)
-- ARGV[1] ttl in ms, ARGV[i+1] the hold id for the i-th lock
-- returns the tokens, in KEYS' order, if every hold holds its lock now (each
-- just taken, or held by that hold already: a retry, whose expiry is reset
-- to ARGV[1] from now); else, changing nothing, the ms until the lease of a
-- lock that is held ends (-1: unknown, e.g. the lock is free with a queue
-- waiting for its turn, which the multi-lock does not jump)

local ttl = tonumber(ARGV[1])
local n = #KEYS / 2
local found = {}
for i = 1, n do
  X, Q = KEYS[2 * i - 1], KEYS[2 * i]
  local v = redis.call('GET', X)
  if v then
    local tok, count, flag, exp, holder = parse(v)
    if holder and holder ~= ARGV[i + 1] then return redis.call('PTTL', X) end
    if holder then found[i] = {tonumber(tok), count, flag} else found[i] = tonumber(v) end
  elseif redis.call('EXISTS', Q) == 1 then
    return -1
  end
end
local tokens = {}
for i = 1, n do
  X = KEYS[2 * i - 1]
  local hold, held = ARGV[i + 1], found[i]
  if type(held) == 'table' then
    hold_x(held[1], held[2], held[3], hold, ttl)
    tokens[i] = held[1]
  else
    local t = token(held)
    hold_x(t, 1, '-', hold, ttl)
    tokens[i] = t
  end
end
return tokens
