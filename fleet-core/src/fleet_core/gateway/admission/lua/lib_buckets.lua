-- Token-bucket helpers shared by admit.lua and settle.lua. Not a script of its own: the store
-- (`store.script_source`) puts this text where a script says `-- #include lib_buckets.lua`, since
-- a Redis script cannot include another. Each function repeats fleet_core/gateway/admission/buckets.py
-- operation for operation: change both together.

local MIN_TTL_S = 120

local function rate(capacity)
  return capacity / 60
end

local function refill(level, elapsed, capacity)
  return math.min(capacity, level + math.max(0, elapsed) * rate(capacity))
end

local function ttl(level, capacity)
  if capacity <= 0 then
    return MIN_TTL_S
  end
  return math.max(MIN_TTL_S, 2 * (capacity - level) / rate(capacity))
end

local function clock()
  local time = redis.call('TIME')
  return tonumber(time[1]) + tonumber(time[2]) / 1000000
end

-- The state epoch of the keys' hash tag (ADR 0023): a hash {id, since, lost} that is never
-- written with an expiry, so its absence means this Redis has never seen the tag or has lost
-- everything it held (restarted empty, flushed, failed over to a replica that had not caught up).
-- `known` is the id the calling gateway saw last ('' for none): a gateway that had seen one
-- and finds none, or another, knows the state was lost. For the `WINDOW_S` after a loss, a
-- bucket that is absent was not full but lost: it counts as emptied at the loss and refilled
-- since, so nothing admitted before the loss can be admitted again. Returns the epoch's id.
local WINDOW_S = 60 -- a bucket refills completely in a minute (rate = capacity / 60)
local lost_since = nil

local function epoch(key, known, now)
  local state = redis.call('HMGET', key, 'id', 'since', 'lost')
  local id, since, lost = state[1], tonumber(state[2]), state[3] == '1'
  if not id then
    id, since, lost = string.format('%.6f', now), now, known ~= ''
    redis.call('HSET', key, 'id', id, 'since', string.format('%.17g', now), 'lost', lost and '1' or '0')
  elseif known ~= '' and known ~= id and not lost and now - since < WINDOW_S then
    lost = true -- a gateway that never knew the old epoch made this one: it was a loss all the same
    redis.call('HSET', key, 'lost', '1')
  end
  if lost and now - since < WINDOW_S then
    lost_since = since
  end
  return id
end

local function current(key, capacity, now)
  local state = redis.call('HMGET', key, 'level', 'ts')
  if not state[1] or not state[2] then
    if lost_since then
      return refill(0, now - lost_since, capacity)
    end
    return capacity
  end
  return refill(tonumber(state[1]), now - tonumber(state[2]), capacity)
end

local function store(key, level, capacity, now)
  -- %.17g keeps every bit of a double, so a stored level reads back exactly.
  redis.call('HSET', key, 'level', string.format('%.17g', level), 'ts', string.format('%.17g', now))
  redis.call('PEXPIRE', key, string.format('%d', math.ceil(ttl(level, capacity) * 1000)))
end
