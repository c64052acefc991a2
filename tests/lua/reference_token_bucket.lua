-- Reference token bucket: the EVAL script TB.TAKE replaces, kept as the baseline that
-- tests compare against and benchmarks race.
--
-- KEYS[1]  bucket hash with fields `tokens` and `last_refill` (Unix ms)
-- ARGV[1]  capacity  tokens when full
-- ARGV[2]  rate      tokens added per second
-- ARGV[3]  n         tokens this call takes
-- ARGV[4]  now_ms    the caller's clock, Unix ms (scripts cannot read a clock that replicates)
-- Returns  {allowed (1 or 0), floor(tokens left)}
--
-- Differences from TB.TAKE, on purpose (they are what the module fixes):
-- * it writes the hash and the TTL on every call, denied ones included;
-- * the TTL is twice the time to fill an empty bucket, relative, not the time until full;
-- * the clock comes from the caller, so callers with skewed clocks disagree.

local bucket = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate_per_sec = tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local now_ms = tonumber(ARGV[4])

local fields = redis.call('HMGET', bucket, 'tokens', 'last_refill')
local tokens = tonumber(fields[1])
local last_refill_ms = tonumber(fields[2])

-- A bucket never seen (or half written) starts full.
if tokens == nil or last_refill_ms == nil then
  tokens = capacity
  last_refill_ms = now_ms
end

local elapsed_ms = math.max(0, now_ms - last_refill_ms)
local available = math.min(capacity, tokens + elapsed_ms / 1000 * rate_per_sec)

local allowed = 0
if available >= wanted then
  allowed = 1
  available = available - wanted
end

-- Numbers reach HSET as "%.17g" text, which reads back to the same double.
redis.call('HSET', bucket, 'tokens', available, 'last_refill', ARGV[4])

local ttl_ms = math.ceil(capacity / rate_per_sec * 1000) * 2
ttl_ms = math.max(1, math.min(ttl_ms, 2 ^ 53))
redis.call('PEXPIRE', bucket, ttl_ms)

return {allowed, math.floor(available)}
