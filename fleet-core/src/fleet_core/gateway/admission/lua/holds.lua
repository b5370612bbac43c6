-- Update gateways' budget allowances in one round trip: signed deltas (an overrun at settlement,
-- use the rollups now show taken out, slack given back), touches (a delta of 0: kept another
-- ttl) and growths taken back whose admission's answer was lost.
--
-- KEYS[1]               the batch's marker: set (with expiry ARGV[1] seconds) the first time the
--                       batch is applied, so a batch sent again (its reply was lost, the gateway
--                       retried) is applied once. It shares the books' hash tag.
-- KEYS[2r], KEYS[2r+1]  budget rule r's book: a hash {sum, <owner> = amount} and a sorted set
--                       <owner> -> expiry (ms). All keys share the tenant's hash tag.
-- ARGV[1]               the marker's time to live in seconds (longer than any retry of the batch)
-- then                  for each rule r in turn: u, then u updates of five (owner, delta, keep:
--                       the entry as its gateway means it after the update, made again at that if
--                       it is gone, ttl_ms, grant id to take back or '')
--
-- Returns 1 if the batch was applied now, 0 if it had been already. Time is Redis's own (TIME).
-- The helpers (change, undo …) come from lib_holds.lua, shared with admit.lua.

-- #include lib_holds.lua

if not redis.call('SET', KEYS[1], '1', 'EX', ARGV[1], 'NX') then
  return 0
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local pos = 2
for r = 1, (#KEYS - 1) / 2 do
  local book, expiry = KEYS[2 * r], KEYS[2 * r + 1]
  for _ = 1, tonumber(ARGV[pos]) do
    local owner, delta, again = ARGV[pos + 1], tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])
    if ARGV[pos + 5] ~= '' then
      delta = delta - undo(book, ARGV[pos + 5])
    end
    change(book, expiry, owner, delta, again, tonumber(ARGV[pos + 4]), now_ms)
    pos = pos + 5
  end
  pos = pos + 1
end
keep_books()
return 1
