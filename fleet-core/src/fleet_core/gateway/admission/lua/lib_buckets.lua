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

local function current(key, capacity, now)
  local state = redis.call('HMGET', key, 'level', 'ts')
  if not state[1] or not state[2] then
    return capacity
  end
  return refill(tonumber(state[1]), now - tonumber(state[2]), capacity)
end

local function store(key, level, capacity, now)
  -- %.17g keeps every bit of a double, so a stored level reads back exactly.
  redis.call('HSET', key, 'level', string.format('%.17g', level), 'ts', string.format('%.17g', now))
  redis.call('PEXPIRE', key, string.format('%d', math.ceil(ttl(level, capacity) * 1000)))
end
