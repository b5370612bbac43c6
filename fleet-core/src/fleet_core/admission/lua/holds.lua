-- Update budget holds in one round trip: settle (set a hold to what was used), touch (keep it
-- for another ttl) or drop (the record is in the rollups now, or the request never started).
--
-- KEYS[2r-1], KEYS[2r]   budget rule r's book: a hash {sum, <hold id> = amount} and a sorted set
--                        <hold id> -> expiry (ms). All keys share the tenant's hash tag.
-- ARGV: for each rule r in turn: u, then u triples (hold id, amount or -1 to drop, ttl_ms)
--
-- Returns nothing. Time is Redis's own (TIME). The helpers repeat admit.lua's; change them
-- together (and store.MemoryStore, which mirrors them).

-- HINCRBY takes integers only; Lua would send 0 negated as "-0", which it refuses.
local function add(book, delta)
  if delta ~= 0 then
    redis.call('HINCRBY', book, 'sum', string.format('%d', delta))
  end
end

local function keep(key, ttl_ms)
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
end

local function put(book, expiry, id, amount, ttl_ms, now_ms)
  local old = tonumber(redis.call('HGET', book, id) or '0')
  redis.call('HSET', book, id, string.format('%d', amount))
  add(book, amount - old)
  redis.call('ZADD', expiry, now_ms + ttl_ms, id)
  keep(book, ttl_ms)
  keep(expiry, ttl_ms)
end

local function drop(book, expiry, id)
  local amount = redis.call('HGET', book, id)
  redis.call('ZREM', expiry, id)
  if amount then
    redis.call('HDEL', book, id)
    add(book, -tonumber(amount))
  end
end

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local pos = 1
for r = 1, #KEYS / 2 do
  local book, expiry = KEYS[2 * r - 1], KEYS[2 * r]
  for _ = 1, tonumber(ARGV[pos]) do
    local id, amount = ARGV[pos + 1], tonumber(ARGV[pos + 2])
    if amount < 0 then
      drop(book, expiry, id)
    else
      put(book, expiry, id, amount, tonumber(ARGV[pos + 3]), now_ms)
    end
    pos = pos + 3
  end
  pos = pos + 1
end
