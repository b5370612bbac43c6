-- Admit requests against their buckets, each all or nothing, in one round trip (P5).
--
-- One call carries one or more reservations (the gateway batches the reservations of one tenant
-- that arrive in the same event-loop tick); they are judged in order, each seeing the levels the
-- ones before it left, exactly as if they had come one call each.
--
-- KEYS[i]           bucket i: a hash {level, ts}; absent means full. All keys share a hash tag.
-- ARGV[i], i <= #KEYS   bucket i's capacity (per minute; it refills capacity/60 per second)
-- ARGV[#KEYS + 1]   R, the number of reservations; then for each: n, and n pairs
--                   (bucket index, amount to take)
--
-- Returns three numbers per reservation: {1, 0, 0} when every bucket held its amount (all were
-- charged), else {0, j, retry_ms}: j is the reservation's refusing pair with the longest wait,
-- retry_ms that wait rounded up (-1: never fits), and nothing of that reservation was charged.
-- Time is Redis's own (TIME), so every gateway shares one clock.
--
-- The helpers repeat fleet_core/admission/buckets.py operation for operation (and settle.lua
-- repeats them here: a script cannot include another). Change all three together.

local MIN_TTL_S = 120

local function rate(capacity)
  return capacity / 60
end

local function refill(level, elapsed, capacity)
  return math.min(capacity, level + math.max(0, elapsed) * rate(capacity))
end

local function retry_after(level, amount, capacity)
  if amount > capacity or capacity <= 0 then
    return math.huge
  end
  return math.max(0, (amount - level) / rate(capacity))
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

local now = clock()
local count = #KEYS
local capacities, levels, touched = {}, {}, {}
for i = 1, count do
  capacities[i] = tonumber(ARGV[i])
  levels[i] = current(KEYS[i], capacities[i], now)
end

local out = {}
local pos = count + 2
for _ = 1, tonumber(ARGV[count + 1]) do
  local n = tonumber(ARGV[pos])
  local worst, worst_wait = 0, -1
  for j = 1, n do
    local i, amount = tonumber(ARGV[pos + 2 * j - 1]), tonumber(ARGV[pos + 2 * j])
    if levels[i] < amount then
      local wait = retry_after(levels[i], amount, capacities[i])
      if wait > worst_wait then
        worst, worst_wait = j, wait
      end
    end
  end
  if worst > 0 then
    local retry_ms = -1
    if worst_wait ~= math.huge then
      retry_ms = math.ceil(worst_wait * 1000)
    end
    out[#out + 1], out[#out + 2], out[#out + 3] = 0, worst, retry_ms
  else
    for j = 1, n do
      local i, amount = tonumber(ARGV[pos + 2 * j - 1]), tonumber(ARGV[pos + 2 * j])
      levels[i] = math.min(capacities[i], levels[i] - amount)
      touched[i] = true
    end
    out[#out + 1], out[#out + 2], out[#out + 3] = 1, 0, 0
  end
  pos = pos + 1 + 2 * n
end

for i = 1, count do
  if touched[i] then
    store(KEYS[i], levels[i], capacities[i], now)
  end
end
return out
