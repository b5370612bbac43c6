-- Budget-hold helpers shared by admit.lua and holds.lua. Not a script of its own: the store
-- (`store.script_source`) puts this text where a script says `-- #include lib_holds.lua`, since a
-- Redis script cannot include another. store.MemoryStore mirrors them: change both together.
--
-- A book is a hash {sum, <hold id> = amount} with a sorted set <hold id> -> expiry (ms) beside it.
--
-- Holds are put and dropped a book at a time (`put_many`, `drop_many`): a few commands per book
-- and call, whatever the number of holds (a settlement window or a budget refresh carries
-- hundreds), rather than four per hold. Commands take at most CHUNK holds each (Lua's unpack
-- has a limit). When one id comes several times in a call, its last update is the one that
-- counts, as if they had been applied one by one.

local CHUNK = 1000

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

local function note(book, expiry, ttl_ms)
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

-- Set holds ids[i] to amounts[i] (integers), each expiring ttls[i] ms from now_ms. The ids must
-- be distinct (`last_of` makes them so).
local function put_many(book, expiry, ids, amounts, ttls, now_ms)
  for first = 1, #ids, CHUNK do
    local last = math.min(#ids, first + CHUNK - 1)
    local olds = redis.call('HMGET', book, unpack(ids, first, last))
    local fields, scores, delta = {}, {}, 0
    for i = first, last do
      local id, amount = ids[i], amounts[i]
      fields[#fields + 1], fields[#fields + 2] = id, string.format('%d', amount)
      scores[#scores + 1], scores[#scores + 2] = now_ms + ttls[i], id
      delta = delta + amount - tonumber(olds[i - first + 1] or '0')
      note(book, expiry, ttls[i])
    end
    redis.call('HSET', book, unpack(fields))
    redis.call('ZADD', expiry, unpack(scores))
    add(book, delta)
  end
end

-- Drop holds ids (distinct; unknown ones are skipped).
local function drop_many(book, expiry, ids)
  for first = 1, #ids, CHUNK do
    local last = math.min(#ids, first + CHUNK - 1)
    local amounts = redis.call('HMGET', book, unpack(ids, first, last))
    local freed = 0
    for _, amount in ipairs(amounts) do
      freed = freed + tonumber(amount or '0')
    end
    redis.call('ZREM', expiry, unpack(ids, first, last))
    redis.call('HDEL', book, unpack(ids, first, last))
    add(book, -freed)
  end
end

-- Updates (id, amount or -1 to drop, ttl_ms) in order, as the puts and drops they come to: the
-- last update of each id wins, as it would applied one at a time.
local function last_of(updates)
  local at, ids = {}, {}
  for i, update in ipairs(updates) do
    if at[update[1]] == nil then
      ids[#ids + 1] = update[1]
    end
    at[update[1]] = i
  end
  local puts, amounts, ttls, drops = {}, {}, {}, {}
  for _, id in ipairs(ids) do
    local update = updates[at[id]]
    if update[2] < 0 then
      drops[#drops + 1] = id
    else
      puts[#puts + 1], amounts[#amounts + 1], ttls[#ttls + 1] = id, update[2], update[3]
    end
  end
  return puts, amounts, ttls, drops
end

local function apply(book, expiry, updates, now_ms)
  local puts, amounts, ttls, drops = last_of(updates)
  drop_many(book, expiry, drops)
  put_many(book, expiry, puts, amounts, ttls, now_ms)
end
