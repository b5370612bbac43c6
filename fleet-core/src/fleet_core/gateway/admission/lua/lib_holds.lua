-- Budget-allowance helpers shared by admit.lua and holds.lua. Not a script of its own: the store
-- (`store.script_source`) puts this text where a script says `-- #include lib_holds.lua`, since a
-- Redis script cannot include another. store.MemoryStore mirrors them: change both together.
--
-- A book is a hash {sum, <owner> = amount} with a sorted set <owner> -> expiry (ms) beside it:
-- one entry per gateway process (its allowance), not one per request. Entries change only by
-- signed deltas, which commute, so calls from one gateway's pooled connections may land in any
-- order and still sum to what it meant; each call is applied at most once (holds.lua's batch
-- marker, the grant markers below), so a call sent again after a lost reply is not counted twice.
--
-- A growth (admit.lua) leaves a marker <book>:grant:<id> = amount grown, so that its gateway,
-- when the answer was lost, can take it back exactly once (`undo`); an undo that comes first
-- leaves 'x' there, and the growth, arriving later, is refused. Marker keys are made here from
-- the book's name, so they share its hash tag (and Cluster slot).

local SLACK_SHARE = 16 -- a growth's slack is at most this share of the room left after its need
local MARK_TTL_MS = 600000 -- how long a grant's marker lives: longer than its undo is retried

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

-- The books a script wrote, each with the longest ttl it was given, in first-write order:
-- `keep_books` extends each book (and its expiry set) once at the end of the script.
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

-- Drop entries (expired ones; unknown ones are skipped), a chunk at a time (unpack's limit).
local CHUNK = 1000
local function drop_many(book, expiry, owners)
  for first = 1, #owners, CHUNK do
    local last = math.min(#owners, first + CHUNK - 1)
    local amounts = redis.call('HMGET', book, unpack(owners, first, last))
    local freed = 0
    for _, amount in ipairs(amounts) do
      freed = freed + tonumber(amount or '0')
    end
    redis.call('ZREM', expiry, unpack(owners, first, last))
    redis.call('HDEL', book, unpack(owners, first, last))
    add(book, -freed)
  end
end

-- Change owner's entry by delta (never below 0) and keep it ttl_ms from now_ms. An entry that is
-- gone (expired, or lost with the store) is made again at `again`, the gateway's whole figure
-- after this change, when that is >= 0, and left gone otherwise: a bare delta never makes an
-- entry, so one landing after its entry was made again is not counted twice.
local function change(book, expiry, owner, delta, again, ttl_ms, now_ms)
  local old = redis.call('HGET', book, owner)
  local new
  if old then
    old = tonumber(old)
    new = math.max(0, old + delta)
  elseif again >= 0 then
    old, new = 0, again
    redis.call('HSET', book, owner, string.format('%d', new))
  else
    return
  end
  if new ~= old then
    redis.call('HSET', book, owner, string.format('%d', new))
    add(book, new - old)
  end
  redis.call('ZADD', expiry, now_ms + ttl_ms, owner)
  note(book, expiry, ttl_ms)
end

local function grant_key(book, id)
  return book .. ':grant:' .. id
end

-- Take back growth `id` of this book if it was made and not yet taken back: the amount to take.
local function undo(book, id)
  local marker = grant_key(book, id)
  local grown = redis.call('GET', marker)
  redis.call('SET', marker, 'x', 'PX', MARK_TTL_MS)
  if grown and grown ~= 'x' then
    return tonumber(grown)
  end
  return 0
end
