-- Update budget holds in one round trip: settle (set a hold to what was used), touch (keep it
-- for another ttl) or drop (the record is in the rollups now, or the request never started).
--
-- KEYS[2r-1], KEYS[2r]   budget rule r's book: a hash {sum, <hold id> = amount} and a sorted set
--                        <hold id> -> expiry (ms). All keys share the tenant's hash tag.
-- ARGV: for each rule r in turn: u, then u triples (hold id, amount or -1 to drop, ttl_ms)
--
-- Returns nothing. Time is Redis's own (TIME). The hold helpers (apply: the puts and drops of one
-- book in a few commands) come from lib_holds.lua, shared with admit.lua.

-- #include lib_holds.lua

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local pos = 1
for r = 1, #KEYS / 2 do
  local updates = {}
  for _ = 1, tonumber(ARGV[pos]) do
    updates[#updates + 1] = {ARGV[pos + 1], tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])}
    pos = pos + 3
  end
  pos = pos + 1
  apply(KEYS[2 * r - 1], KEYS[2 * r], updates, now_ms)
end
keep_books()
