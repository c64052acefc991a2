-- tb_take.lua: TB.TAKE as a Lua script, for servers that cannot load modules
-- (managed Redis, hosted Valkey). Same reply, same hash, same TTL, same errors
-- as the redis-tb module, so either can take over a bucket from the other.
--
--   EVALSHA <sha> 1 <key> <capacity> <rate> <n>
--     capacity  tokens when full (the largest burst)
--     rate      tokens added per second
--     n         tokens this call takes (0 = just look)
--   -> {allowed, remaining, retry_after_ms, reset_after_ms}
--
-- On Redis 7+ prefer lua/tb_library.lua (FUNCTION LOAD, then FCALL tb_take):
-- a function is stored with the data (RDB, AOF) and replicated, so no NOSCRIPT.
--
-- Written for Redis 4+ (a write after TIME needs effects replication, the
-- default since 5; Redis 4 gets it from the replicate_commands() call below);
-- tested on Redis 7.0 and Valkey 8.1/9.1. The clock is the server's TIME,
-- never the caller's.
-- Replicas and the AOF receive the effects (HSET, PEXPIREAT with an absolute
-- deadline), never this script.
--
-- Known differences from the module (see tests/lua_fallback.rs):
-- * no INFO tb counters, and tb.shadow-mode does not apply.
-- * a wrong number of arguments is reported in TB.TAKE's words, but by the
--   script (the server cannot check a script's arity).
-- * ACL applies to the commands inside: a restricted user needs EVALSHA (or
--   FCALL) and TYPE, HMGET, TIME, HSET, PEXPIREAT. Without PEXPIREAT the
--   script fails after its HSET, and a script is not rolled back.

if redis.replicate_commands then
  redis.replicate_commands()
end

-- BEGIN tb_take: everything down to END is the same text in lua/tb_take.lua
-- and lua/tb_library.lua (tests/lua_fallback.rs checks that). Each step
-- mirrors src/bucket.rs and src/number.rs operation for operation, so both
-- produce the same doubles.

-- The longest wait ever reported or turned into a TTL: 2^53 ms.
local MAX_WAIT_MS = 9007199254740992
-- Arguments and stored fields longer than this are refused.
local MAX_LEN = 64

-- The largest capacity and n a request may name (src/bucket.rs MAX_TOKENS).
local MAX_TOKENS = 9007199254740992

local ERR_CAPACITY = 'ERR capacity must be a positive finite number'
local ERR_CAPACITY_TOO_LARGE = 'ERR capacity must be at most 9007199254740992 (2^53)'
local ERR_RATE = 'ERR rate must be a positive finite number'
local ERR_N = 'ERR n must be a non-negative finite number'
local ERR_N_TOO_LARGE = 'ERR n must be at most 9007199254740992 (2^53)'
local ERR_ARITY = "ERR wrong number of arguments for 'tb.take' command"
local ERR_WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'

-- `[sign] (digits [. digits*] | . digits) [(e|E) [sign] digits]`, at most 64
-- bytes, finite; the sign only where `signed` (stored fields). tonumber()
-- alone would also take hex, inf, nan and surrounding spaces.
local function parse_decimal(text, signed)
  if type(text) ~= 'string' or #text == 0 or #text > MAX_LEN then
    return nil
  end
  local body = text
  if signed then
    body = string.match(text, '^[+-]?(.*)$')
  end
  local mantissa = string.match(body, '^([%d.]*)[eE][+-]?%d+$') or body
  if not (string.match(mantissa, '^%d+%.?%d*$') or string.match(mantissa, '^%.%d+$')) then
    return nil
  end
  local value = tonumber(text)
  if value == nil or value ~= value or value == math.huge or value == -math.huge then
    return nil
  end
  return value
end

-- The key as the module names it in an error: printable ASCII kept, ' and \
-- escaped, other bytes as \xNN, cut to 64 bytes.
local function show_key(key)
  local shown = string.gsub(string.sub(key, 1, 64), '.', function(c)
    local byte = string.byte(c)
    if c == "'" or c == '\\' then
      return '\\' .. c
    elseif byte >= 32 and byte <= 126 then
      return c
    end
    return string.format('\\x%02x', byte)
  end)
  if #key > 64 then
    shown = shown .. '...'
  end
  return shown
end

-- src/bucket.rs State::available_at, same operations in the same order.
local function available_at(tokens, last_refill, capacity, rate, now)
  local elapsed = math.max(now - last_refill, 0)
  local refilled = math.max(tokens, 0) + elapsed / 1000 * rate
  return math.min(refilled, capacity)
end

-- src/bucket.rs clamp_wait.
local function clamp_wait(ms)
  if ms ~= ms or ms >= MAX_WAIT_MS then
    return MAX_WAIT_MS
  elseif ms <= 0 then
    return 0
  end
  return ms
end

-- src/bucket.rs first_ms_when: the fewest whole ms w in [0, 2^53] such that
-- the bucket holds `wanted` at now + w. A closed-form guess, then a galloping
-- search around it and a bisection, exactly as the module does, so the answer
-- is the module's to the ms. All values stay integers <= 2^54, exact in doubles.
local function first_ms_when(tokens, last_refill, capacity, rate, now, wanted)
  local function ready(wait)
    return available_at(tokens, last_refill, capacity, rate, now + wait) >= wanted
  end
  if ready(0) then
    return 0
  end
  local deficit = wanted - available_at(tokens, last_refill, capacity, rate, now)
  local guess = clamp_wait(math.ceil(deficit / rate * 1000))
  local step = 1
  local not_ready, is_ready
  if ready(guess) then
    is_ready = guess
    while true do
      local probe = is_ready - step
      if probe <= 0 then
        not_ready = 0
        break
      end
      if not ready(probe) then
        not_ready = probe
        break
      end
      is_ready = probe
      step = step * 2
    end
  else
    not_ready = guess
    while true do
      local probe = not_ready + step
      if probe >= MAX_WAIT_MS then
        is_ready = MAX_WAIT_MS
        break
      end
      if ready(probe) then
        is_ready = probe
        break
      end
      not_ready = probe
      step = step * 2
    end
  end
  while is_ready - not_ready > 1 do
    local mid = not_ready + math.floor((is_ready - not_ready) / 2)
    if ready(mid) then
      is_ready = mid
    else
      not_ready = mid
    end
  end
  return is_ready
end

-- The decimal digits and exponent of the value `text` ("d.ddde+XX") holds.
local function split_exponent_form(text)
  local first, rest, exponent = string.match(text, '^(%d)%.?(%d*)e([-+]%d+)$')
  return first .. rest, tonumber(exponent)
end

-- `digits` (a decimal string) plus one unit in its last place; the exponent
-- moves up when the carry adds a digit (999 -> 100, one place higher).
local function next_up(digits, exponent)
  local i = #digits
  while i >= 1 and string.sub(digits, i, i) == '9' do
    i = i - 1
  end
  if i == 0 then
    return '1' .. string.rep('0', #digits - 1), exponent + 1
  end
  local bumped = string.char(string.byte(digits, i) + 1)
  return string.sub(digits, 1, i - 1) .. bumped .. string.rep('0', #digits - i), exponent
end

-- `digits` as text Lua reads back ("d.ddde<exponent>").
local function as_text(digits, exponent)
  return string.sub(digits, 1, 1) .. '.' .. string.sub(digits, 2) .. 'e' .. exponent
end

-- The shortest decimal digits that read back as `x` (x > 0, finite), and the
-- exponent of the first digit: what Rust's float formatting picks. For each
-- length, C's correctly rounded digits are the nearest candidate; Rust may
-- prefer the next one up, in two cases handled below.
local function shortest_digits(x)
  -- The exact value (a double has at most 17 significant digits that matter
  -- here; '%.99e' is the most Lua 5.1's string.format allows).
  local exact_digits, exact_exponent = split_exponent_form(string.format('%.99e', x))
  exact_digits = string.match(exact_digits, '^(.-)0*$')
  for precision = 1, 17 do
    local digits, exponent = split_exponent_form(string.format('%.' .. (precision - 1) .. 'e', x))
    local back = tonumber(as_text(digits, exponent))
    if back == x then
      -- x exactly halfway between this candidate and the next one up, both
      -- reading back as x: C rounds to even, Rust takes the upper one.
      if exponent == exact_exponent and exact_digits == digits .. '5' then
        return next_up(digits, exponent)
      end
      return digits, exponent
    end
    -- Just above a power of two the doubles below are twice as dense, so the
    -- nearest candidate (rounded down) can miss while the next one up, still
    -- as short, reads back as x. Rust picks that one; so do we.
    if back < x then
      local up, up_exponent = next_up(digits, exponent)
      if tonumber(as_text(up, up_exponent)) == x then
        return up, up_exponent
      end
    end
  end
  return split_exponent_form(string.format('%.16e', x))
end

-- src/number.rs format_tokens: the shortest text that reads back as the same
-- double; plain for 0 and 1e-4 <= |x| < 1e15 (Rust's `{}`), else exponent
-- form without '+' or leading zeros (Rust's `{:e}`: 1e300, 1.5e-7).
local function format_tokens(x)
  if x == 0 then
    if 1 / x < 0 then
      return '-0'
    end
    return '0'
  end
  local sign = ''
  if x < 0 then
    sign = '-'
    x = -x
  end
  local digits, exponent = shortest_digits(x)
  digits = string.match(digits, '^(.-)0*$')
  if digits == '' then
    digits = '0'
  end
  if x >= 1e-4 and x < 1e15 then
    if exponent < 0 then
      return sign .. '0.' .. string.rep('0', -exponent - 1) .. digits
    elseif #digits <= exponent + 1 then
      return sign .. digits .. string.rep('0', exponent + 1 - #digits)
    end
    return sign .. string.sub(digits, 1, exponent + 1) .. '.' .. string.sub(digits, exponent + 2)
  end
  local mantissa = string.sub(digits, 1, 1)
  if #digits > 1 then
    mantissa = mantissa .. '.' .. string.sub(digits, 2)
  end
  return sign .. mantissa .. 'e' .. exponent
end

-- a + b as exact integer text, for integers 0 <= a, b <= 2^53: their sum may
-- pass 2^53, where doubles skip odd integers.
local function add_ms(a, b)
  local unit = 100000000
  local a_low, b_low = math.fmod(a, unit), math.fmod(b, unit)
  local low = a_low + b_low
  local high = (a - a_low) / unit + (b - b_low) / unit
  if low >= unit then
    low = low - unit
    high = high + 1
  end
  if high == 0 then
    return string.format('%d', low)
  end
  return string.format('%d%08d', high, low)
end

local function tb_take(keys, argv)
  if #keys ~= 1 or #argv ~= 3 then
    return redis.error_reply(ERR_ARITY)
  end
  local key = keys[1]
  local capacity = parse_decimal(argv[1], false)
  if capacity == nil or not (capacity > 0) then
    return redis.error_reply(ERR_CAPACITY)
  end
  if capacity > MAX_TOKENS then
    return redis.error_reply(ERR_CAPACITY_TOO_LARGE)
  end
  local rate = parse_decimal(argv[2], false)
  if rate == nil or not (rate > 0) then
    return redis.error_reply(ERR_RATE)
  end
  local n = parse_decimal(argv[3], false)
  if n == nil then
    return redis.error_reply(ERR_N)
  end
  if n > MAX_TOKENS then
    return redis.error_reply(ERR_N_TOO_LARGE)
  end

  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= 'hash' then
    return redis.error_reply(ERR_WRONGTYPE)
  end
  local tokens, last_refill
  if kind == 'hash' then
    local fields = redis.call('HMGET', key, 'tokens', 'last_refill')
    tokens = parse_decimal(fields[1], true)
    last_refill = parse_decimal(fields[2], true)
    if tokens == nil or last_refill == nil then
      return redis.error_reply('ERR corrupt bucket \'' .. show_key(key)
        .. '\': tokens and last_refill must be finite numbers')
    end
  end

  -- The server's clock in ms, read once: RedisModule_Milliseconds() is
  -- the same sec * 1000 + usec / 1000, rounded down.
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- A missing key is a full bucket: it expires exactly when it would be full.
  -- A last_refill later than now (the clock stepped back) counts as now and
  -- is repaired to now by this call, allowed or denied (src/bucket.rs seen_at).
  local repair = false
  if tokens == nil then
    tokens, last_refill = capacity, now
  elseif last_refill > now then
    last_refill = now
    repair = true
  end

  local available = available_at(tokens, last_refill, capacity, rate, now)
  local allowed = not (available < n)
  local left, write, reset_after
  if allowed and n > 0 then
    left, write = available - n, true
    -- Time to full from what is stored after this call.
    reset_after = first_ms_when(left, now, capacity, rate, now, capacity)
  else
    left, write = available, repair
    reset_after = first_ms_when(tokens, last_refill, capacity, rate, now, capacity)
  end
  if write then
    -- Expire exactly when the bucket is full again, at an absolute instant,
    -- so replicas and a reloaded AOF drop the key at the same ms. A denial
    -- writes only a clock repair; otherwise nothing at all.
    redis.call('HSET', key, 'tokens', format_tokens(left), 'last_refill', string.format('%d', now))
    redis.call('PEXPIREAT', key, add_ms(now, math.max(1, reset_after)))
  end
  if not allowed then
    local retry_after = -1
    if not (n > capacity) then
      retry_after = first_ms_when(tokens, last_refill, capacity, rate, now, n)
    end
    return {0, math.floor(available), retry_after, reset_after}
  end
  return {1, math.floor(left), 0, reset_after}
end
-- END tb_take

return tb_take(KEYS, ARGV)
