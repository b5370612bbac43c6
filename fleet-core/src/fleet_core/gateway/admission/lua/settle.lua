-- Settle one request against all its buckets in one round trip (P5): signed corrections.
--
-- KEYS[1]      the batch's marker: set (with expiry ARGV[1] seconds) the first time the batch is
--              applied, so a batch sent again (its reply was lost, the gateway retried) is applied
--              once. It shares the buckets' hash tag, so one call stays in one Cluster slot.
-- ARGV[1]      the marker's time to live in seconds (longer than any retry of the batch)
-- KEYS[i+1]    bucket i: a hash {level, ts}; absent means full. All keys share a hash tag.
-- ARGV[2i]     bucket i's capacity (per minute; it refills capacity/60 per second)
-- ARGV[2i+1]   the correction for bucket i: positive takes more (the level may go below zero:
--              an overrun delays whoever comes next), negative refunds (capped at capacity)
-- KEYS[#KEYS]  the hash tag's state epoch, ARGV[#ARGV] the id the gateway saw last (`epoch`)
--
-- Returns the epoch's id if the batch was applied now, '' if it had been already. Time is
-- Redis's own (TIME), so every gateway shares one clock.
--
-- The bucket helpers (current, store, clock …) come from lib_buckets.lua, shared with admit.lua;
-- they repeat fleet_core/gateway/admission/buckets.py operation for operation.

-- #include lib_buckets.lua

if not redis.call('SET', KEYS[1], '1', 'EX', ARGV[1], 'NX') then
  return ''
end
local now = clock()
local id = epoch(KEYS[#KEYS], ARGV[#ARGV], now)
for i = 2, #KEYS - 1 do
  local capacity, amount = tonumber(ARGV[2 * i - 2]), tonumber(ARGV[2 * i - 1])
  store(KEYS[i], math.min(capacity, current(KEYS[i], capacity, now) - amount), capacity, now)
end
return id
