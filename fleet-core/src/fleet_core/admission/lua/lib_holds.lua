-- Budget-hold helpers shared by admit.lua and holds.lua. Not a script of its own: the store
-- (`store.script_source`) puts this text where a script says `-- #include lib_holds.lua`, since a
-- Redis script cannot include another. store.MemoryStore mirrors them: change both together.
--
-- A book is a hash {sum, <hold id> = amount} with a sorted set <hold id> -> expiry (ms) beside it.

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

-- The books a script put holds in, each with the longest ttl it was given, in first-put order:
-- `keep_books` extends each book (and its expiry set) once at the end of the script, rather than
-- after every put (a batch puts many holds in one book; the keys end with the same ttl).
local kept_order, kept_ttl, kept_expiry = {}, {}, {}

local function put(book, expiry, id, amount, ttl_ms, now_ms)
  local old = tonumber(redis.call('HGET', book, id) or '0')
  redis.call('HSET', book, id, string.format('%d', amount))
  add(book, amount - old)
  redis.call('ZADD', expiry, now_ms + ttl_ms, id)
  if kept_ttl[book] == nil then
    kept_order[#kept_order + 1], kept_expiry[book], kept_ttl[book] = book, expiry, ttl_ms
  elseif ttl_ms > kept_ttl[book] then
    kept_ttl[book] = ttl_ms
  end
end

local function keep_books()
  for _, book in ipairs(kept_order) do
    keep(book, kept_ttl[book])
    keep(kept_expiry[book], kept_ttl[book])
  end
end

local function drop(book, expiry, id)
  local amount = redis.call('HGET', book, id)
  redis.call('ZREM', expiry, id)
  if amount then
    redis.call('HDEL', book, id)
    add(book, -tonumber(amount))
  end
end
