-- The concurrency limit TB.ACQUIRE replaces, as people write it: a sorted set of
-- holders scored by their deadline, called with EVALSHA to acquire and released
-- with a plain ZREM. What bench/lease_bench.py races (our own text).
--
-- KEYS[1]  the semaphore (sorted set: holder -> deadline, Unix ms)
-- ARGV[1]  limit       how many holders at once
-- ARGV[2]  lease_ms    how long a holder keeps its slot unless released
-- ARGV[3]  holder      the caller's own id for this slot
-- ARGV[4]  now (ms)    optional: the caller's clock; left out, TIME is read
-- Returns  1 acquired, 0 full
-- Release: ZREM KEYS[1] holder

local key, holder = KEYS[1], ARGV[3]
local limit, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
-- The caller's clock, else the server's, read as bench/reference_token_bucket.lua
-- reads it. Each script is sent alone (SCRIPT LOAD) and cannot include the
-- other, so these five lines stand in both.
local now = tonumber(ARGV[4])
if now == nil then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now + lease_ms, holder)
  redis.call('PEXPIRE', key, lease_ms)
  return 1
end
return 0
