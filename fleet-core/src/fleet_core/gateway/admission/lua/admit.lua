-- Admit requests against their buckets and budget rules, each all or nothing, in one round trip.
--
-- One call carries one or more reservations (the gateway batches the reservations of one tenant
-- that arrive in the same event-loop tick); they are judged in order, each seeing the levels and
-- entries the ones before it left, exactly as if they had come one call each.
--
-- KEYS[1..B]        the buckets: each a hash {level, ts}; absent means full.
-- KEYS[B+2r-1], KEYS[B+2r]   budget rule r's book: a hash {sum, <owner> = amount} and a sorted
--                   set <owner> -> expiry (ms). All keys share the tenant's hash tag.
-- KEYS[#KEYS]       the hash tag's state epoch (lib_buckets.lua's `epoch`)
-- ARGV[#ARGV]       H, the number of budget rules (so B = #KEYS - 2H - 1); read first
-- ARGV[#ARGV - 1]   the epoch id the gateway saw last ('' for none)
-- ARGV[1..B]        bucket i's capacity (per minute; it refills capacity/60 per second)
-- then              for each rule: its limit and its base (what the rollups count)
-- then              R, the number of reservations; for each: n and n pairs (bucket index, amount
--                   to take), then, only when H > 0, m and m asks of seven (rule index, owner,
--                   grant id, need, extra, keep: the entry as its gateway means it before this
--                   growth, ttl_ms). Without rules the arguments are the bucket-only ones and 0.
--
-- Returns per reservation three numbers, then (only when H > 0) one per ask: what it grew; and
-- last, the epoch's id.
-- {1, 0, 0} when every ask fit and every bucket held its amount (all were taken); {2, k, excess}
-- when ask k would take its rule past the limit (by excess; excess 0: its gateway gave the
-- growth up already, see lib_holds.lua's undo); else {0, j, retry_ms}: j is the reservation's
-- refusing pair with the longest wait, retry_ms that wait rounded up (-1: never fits). A refused
-- reservation takes nothing and grows nothing (its grants are 0).
-- Time is Redis's own (TIME), so every gateway shares one clock; expired entries are dropped first.
--
-- A Redis script cannot include another, so the helpers shared with settle.lua (lib_buckets.lua:
-- they repeat fleet_core/gateway/admission/buckets.py operation for operation) and with holds.lua
-- (lib_holds.lua: store.MemoryStore mirrors them) are put in by the store where a line says
-- `-- #include <file>` (`store.script_source`). retry_after (buckets.py too) is this script's own.

-- #include lib_buckets.lua

local function retry_after(level, amount, capacity)
  if amount > capacity or capacity <= 0 then
    return math.huge
  end
  return math.max(0, (amount - level) / rate(capacity))
end

local PURGE_MAX = 100

-- #include lib_holds.lua

-- The book's live sum, after dropping (at most PURGE_MAX of) the entries that expired.
local function held(book, expiry, now_ms)
  drop_many(book, expiry, redis.call('ZRANGEBYSCORE', expiry, '-inf', now_ms, 'LIMIT', 0, PURGE_MAX))
  return tonumber(redis.call('HGET', book, 'sum') or '0')
end

local now = clock()
local now_ms = math.floor(now * 1000)
local rules = tonumber(ARGV[#ARGV])
local count = #KEYS - 2 * rules - 1
local epoch_id = epoch(KEYS[#KEYS], ARGV[#ARGV - 1], now)
local capacities, levels, touched = {}, {}, {}
for i = 1, count do
  capacities[i] = tonumber(ARGV[i])
  levels[i] = current(KEYS[i], capacities[i], now)
end
local limits, sums = {}, {}
for r = 1, rules do
  limits[r] = tonumber(ARGV[count + 2 * r - 1]) - tonumber(ARGV[count + 2 * r])
  sums[r] = held(KEYS[count + 2 * r - 1], KEYS[count + 2 * r], now_ms)
end
local pos = count + 2 * rules + 1
local ASK = 7

local out = {}
for _ = 1, tonumber(ARGV[pos]) do
  local n = tonumber(ARGV[pos + 1])
  local pairs_at = pos + 1
  local m, asks_at = 0, pairs_at + 2 * n
  if rules > 0 then
    asks_at = asks_at + 1
    m = tonumber(ARGV[asks_at])
  end
  local verdict, which, figure = 1, 0, 0
  if m > 0 then
    local r = tonumber(ARGV[asks_at + 1])
    if redis.call('EXISTS', grant_key(KEYS[count + 2 * r - 1], ARGV[asks_at + 3])) == 1 then
      verdict, which = 2, 1 -- its gateway undid this growth before it came: refuse it
    end
  end
  for k = 1, m do
    if verdict ~= 1 then
      break
    end
    local r, need = tonumber(ARGV[asks_at + ASK * (k - 1) + 1]), tonumber(ARGV[asks_at + ASK * (k - 1) + 4])
    local excess = sums[r] + need - limits[r]
    if need > 0 and excess > 0 then
      verdict, which, figure = 2, k, excess
    end
  end
  if verdict == 1 then
    local worst_wait = -1
    for j = 1, n do
      local i, amount = tonumber(ARGV[pairs_at + 2 * j - 1]), tonumber(ARGV[pairs_at + 2 * j])
      if levels[i] < amount then
        local wait = retry_after(levels[i], amount, capacities[i])
        if wait > worst_wait then
          verdict, which, worst_wait = 0, j, wait
        end
      end
    end
    if verdict == 0 then
      figure = -1
      if worst_wait ~= math.huge then
        figure = math.ceil(worst_wait * 1000)
      end
    end
  end
  out[#out + 1], out[#out + 2], out[#out + 3] = verdict, which, figure
  if verdict == 1 then
    for j = 1, n do
      local i, amount = tonumber(ARGV[pairs_at + 2 * j - 1]), tonumber(ARGV[pairs_at + 2 * j])
      levels[i] = math.min(capacities[i], levels[i] - amount)
      touched[i] = true
    end
  end
  for k = 1, m do
    local at = asks_at + ASK * (k - 1)
    local grown = 0
    if verdict == 1 then
      local r, need, extra = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
      local room = limits[r] - sums[r] - need
      grown = need + math.max(0, math.min(extra, math.floor(room / SLACK_SHARE)))
      if grown > 0 then
        local book = KEYS[count + 2 * r - 1]
        local again = tonumber(ARGV[at + 6]) + grown
        change(book, KEYS[count + 2 * r], ARGV[at + 2], grown, again, tonumber(ARGV[at + 7]), now_ms)
        redis.call('SET', grant_key(book, ARGV[at + 3]), string.format('%d', grown), 'PX', MARK_TTL_MS)
        sums[r] = sums[r] + grown
      end
    end
    out[#out + 1] = grown
  end
  pos = asks_at + ASK * m
end

for i = 1, count do
  if touched[i] then
    store(KEYS[i], levels[i], capacities[i], now)
  end
end
keep_books()
out[#out + 1] = epoch_id
return out
