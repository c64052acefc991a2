-- The token bucket TB.TAKE replaces, as the seeds write it: what `make bench` races and
-- what the tests (tests/it/harness/mod.rs, REFERENCE_LUA) run alongside TB.TAKE.
--
-- KEYS[1]  bucket hash {tokens, last_refill (Unix ms)}
-- ARGV[1]  capacity     tokens when full
-- ARGV[2]  refill rate  tokens added per second
-- ARGV[3]  requested    tokens this call takes
-- ARGV[4]  now (ms)     optional: the caller's clock, as in the seed. When it is
--                       left out the script reads the server clock with TIME,
--                       because redis-benchmark sends the same text on every
--                       call and cannot supply a fresh clock.
-- Returns  {allowed (1/0), floor(tokens left)}
--
-- Kept as the seed has it, on purpose, since this is the cost being compared:
-- it writes HMSET + EXPIRE on every call, denied ones included (Redis then
-- replicates them as MULTI, HMSET, PEXPIREAT, EXEC), and numbers reach HMSET
-- as "%.17g" text.

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local refill_rate = tonumber(ARGV[2])
local requested = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now == nil then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local bucket = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(bucket[1])
local last_refill = tonumber(bucket[2])

if tokens == nil then
  tokens = capacity
  last_refill = now
end

local elapsed = math.max(0, now - last_refill) / 1000
local refilled = math.min(capacity, tokens + elapsed * refill_rate)

local allowed = 0
if refilled >= requested then
  allowed = 1
  refilled = refilled - requested
end

redis.call('HMSET', key, 'tokens', refilled, 'last_refill', now)
redis.call('EXPIRE', key, math.ceil(capacity / refill_rate) * 2)

return { allowed, math.floor(refilled) }
