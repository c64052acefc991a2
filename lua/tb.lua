#!lua name=tb
-- version 0.1.0: the root Cargo.toml's, like every package of redis-tb (tests/it/release.rs checks it)
-- tb.lua: redis-tb's commands in Lua, for servers that cannot load modules
-- (managed Redis, hosted Valkey). Same replies, same hash, same TTL, same
-- errors as the module, so either can take over a bucket from the other.
-- This one file is both forms; nothing else holds a copy of the algorithm:
--
--   A FUNCTION library (Redis 7+, Valkey), loaded as it is:
--     redis-cli -x FUNCTION LOAD REPLACE < lua/tb.lua
--     FCALL tb_take    1 key capacity rate n [options]
--     FCALL tb_peek    1 key capacity rate [n]      (also FCALL_RO: no-writes)
--     FCALL tb_refund  1 key capacity rate n
--     FCALL tb_takeall N key1 .. keyN capacity1 rate1 n1 .. capacityN rateN nN [options]
--     FCALL tb_charge  1 key capacity rate n [MAXDEBT d]
--     FCALL tb_unblock 1 key
--     FCALL tb_throttle 1 key max_burst count period [quantity]
--     FCALL tb_acquire 1 key limit lease_ms              (TB.ACQUIRE, no timeout_ms)
--     FCALL tb_release 1 key lease
--     FCALL tb_renew   1 key lease lease_ms
--   A functions library is stored with the data (RDB, AOF) and replicated,
--   so clients never see NOSCRIPT.
--
--   A script for EVAL/EVALSHA (any Redis 4+ or Valkey): the same text
--   without its first line (the `#!lua name=tb` line is for FUNCTION LOAD
--   only), with the command's name first in ARGV:
--     EVALSHA <sha> 1 key take capacity rate n [options]
--     EVALSHA <sha> 1 key peek capacity rate [n]
--     EVALSHA <sha> 1 key refund capacity rate n
--     EVALSHA <sha> N key1 .. keyN takeall capacity1 rate1 n1 .. capacityN rateN nN [options]
--     EVALSHA <sha> 1 key charge capacity rate n [MAXDEBT d]
--     EVALSHA <sha> 1 key unblock
--     EVALSHA <sha> 1 key throttle max_burst count period [quantity]
--     EVALSHA <sha> 1 key acquire limit lease_ms
--     EVALSHA <sha> 1 key release lease
--     EVALSHA <sha> 1 key renew lease lease_ms
--   [options] of take and takeall, after the last number, in any case and
--   order: MAXWAIT ms, BLOCK ms, MAXBLOCK ms (core/src/args.rs).
--
-- Each step mirrors core/src/bucket.rs and core/src/number.rs operation for
-- operation, so both produce the same doubles, the same waits to the ms and
-- byte-identical `tokens` text (tests/it/twin/differential.rs compares them). The
-- leases (docs/leases.md) store the module's sorted set, members, scores and
-- expiry (tests/it/twin/leases.rs compares them). The clock is the server's
-- TIME, read once per call, never the caller's. Replicas and the AOF receive
-- the effects (HSET, ZREM, ZADD, PEXPIREAT with an absolute deadline), never
-- the script.
--
-- Known differences from the module (see tests/it/twin/differential.rs):
-- * no TB.BTAKE and no timeout_ms for acquire (a script cannot wait: one
--   more argument is the wrong-arity error), no INFO tb counters, and
--   tb.shadow-mode does not apply;
-- * a wrong number of arguments is reported in the module's words, but by
--   the script (the server cannot check a script's arity);
-- * ACL applies to the commands inside: a restricted user needs FCALL (or
--   EVALSHA) and, for the buckets, TYPE, HMGET, TIME, HSET, PEXPIREAT (and
--   HDEL for unblock, GET and DEL for throttle on a redis-cell key); for
--   the leases, TYPE, ZSCORE, TIME, ZCOUNT, ZRANGEBYSCORE, ZRANGE,
--   PEXPIRETIME, ZREM, ZADD, PEXPIREAT (before Redis 7.0, which has no
--   PEXPIRETIME: PTTL, and an expiry may then come out a ms off the
--   module's), and INFO when an acquire makes a set (its incarnation, see
--   new_incarnation). Without PEXPIREAT the script fails after its write,
--   and a script is not rolled back.

-- 2^53, the one bound of every number taken, stored or reported: capacity
-- and n, whole ms (waits, TTLs, lease_ms, deadlines) and counts; every
-- integer up to it is exact in a double (core/src/number.rs
-- MAX_EXACT_INTEGER).
local MAX_EXACT_INTEGER = 9007199254740992
-- Arguments and stored fields longer than this are refused.
local MAX_LEN = 64

local ERR_CAPACITY = 'ERR capacity must be a positive finite number'
local ERR_CAPACITY_TOO_LARGE = 'ERR capacity must be at most 9007199254740992 (2^53)'
local ERR_RATE = 'ERR rate must be a positive finite number'
local ERR_N = 'ERR n must be a non-negative finite number'
local ERR_N_TOO_LARGE = 'ERR n must be at most 9007199254740992 (2^53)'
local ERR_DUPLICATE = 'ERR each key may appear only once in TB.TAKEALL'
local ERR_WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local ERR_UNKNOWN_OPTION = 'ERR unknown option (TB.TAKE and TB.TAKEALL take MAXWAIT, BLOCK and '
  .. 'MAXBLOCK; TB.CHARGE takes MAXDEBT)'
-- An option's errors name it in upper case (core/src/error.rs OptionName).
local function err_repeated_option(name)
  return 'ERR ' .. name .. ' is given twice'
end
local function err_missing_option_value(name)
  return 'ERR ' .. name .. ' needs a value'
end
local ERR_MAXWAIT = 'ERR MAXWAIT must be a whole number of ms from 0 to 9007199254740992 (2^53)'
local ERR_BLOCK = 'ERR BLOCK must be a whole number of ms from 1 to 9007199254740992 (2^53)'
local ERR_MAXBLOCK =
  'ERR MAXBLOCK must be a whole number of ms from BLOCK to 9007199254740992 (2^53)'
local ERR_MAXBLOCK_WITHOUT_BLOCK = 'ERR MAXBLOCK needs BLOCK'
local ERR_MAXDEBT =
  'ERR MAXDEBT must be a non-negative finite number, at most 9007199254740992 (2^53)'
local ERR_MAX_BURST =
  'ERR max_burst must be a whole number from 0 to 9007199254740991 (2^53 - 1)'
local ERR_THROTTLE_COUNT = 'ERR count must be a whole number from 1 to 9007199254740992 (2^53)'
local ERR_PERIOD =
  'ERR period must be a whole number of seconds from 1 to 9007199254740992 (2^53)'
local ERR_QUANTITY = 'ERR quantity must be a whole number from 0 to 9007199254740992 (2^53)'

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

-- Whether the exact value of `text`, a decimal parse_decimal accepted
-- (unsigned), is above 2^53 (core/src/number.rs above_max_exact_integer):
-- judged on the digits, since 2^53 + 1 and 2^53 + 0.5 become the double
-- 2^53. The value is 0.d1d2... x 10^magnitude, d1 its first digit that is
-- not 0; 2^53 is 0.9007199254740992 x 10^16.
local MAX_EXACT_INTEGER_DIGITS = '9007199254740992'
local function above_max_exact_integer(text)
  local int, frac, exponent = string.match(text, '^(%d*)%.?(%d*)[eE]?([+-]?%d*)$')
  if int == nil then
    return false
  end
  local digits = int .. frac
  local first = string.find(digits, '[1-9]')
  if first == nil then
    return false
  end
  local magnitude = #int - first + 1 + (tonumber(exponent) or 0)
  if magnitude ~= 16 then
    return magnitude > 16
  end
  local significant = string.gsub(string.sub(digits, first), '0+$', '')
  local head = string.sub(significant, 1, 16)
  head = head .. string.rep('0', 16 - #head)
  if head ~= MAX_EXACT_INTEGER_DIGITS then
    return head > MAX_EXACT_INTEGER_DIGITS
  end
  return #significant > 16
end

-- `value`, read from `text`, is at most 2^53 by the exact value of `text`.
local function at_most_max_exact_integer(text, value)
  return value < MAX_EXACT_INTEGER
    or (value == MAX_EXACT_INTEGER and not above_max_exact_integer(text))
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

-- core/src/bucket.rs State::available_at, same operations in the same order.
-- Tokens below zero are debt (MAXWAIT, TB.CHARGE), repaid by the same refill;
-- a deeper hand-edited debt than 2^53 counts as 2^53.
local function available_at(tokens, last_refill, capacity, rate, now)
  local elapsed = math.max(now - last_refill, 0)
  local refilled = math.max(tokens, -MAX_EXACT_INTEGER) + elapsed / 1000 * rate
  return math.min(refilled, capacity)
end

-- core/src/bucket.rs clamp_wait.
local function clamp_wait(ms)
  if ms ~= ms or ms >= MAX_EXACT_INTEGER then
    return MAX_EXACT_INTEGER
  elseif ms <= 0 then
    return 0
  end
  return ms
end

-- core/src/bucket.rs first_ms_when: the fewest whole ms w in [0, 2^53] such that
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
      if probe >= MAX_EXACT_INTEGER then
        is_ready = MAX_EXACT_INTEGER
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

-- core/src/number.rs format_tokens: the shortest text that reads back as the same
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


local function arity_error(command)
  return redis.error_reply("ERR wrong number of arguments for '" .. command .. "' command")
end

-- capacity, rate and n (optional where `n_text` is nil: 1), checked in
-- that order as the module does; returns them, or an error reply.
local function parse_request(capacity_text, rate_text, n_text)
  local capacity = parse_decimal(capacity_text, false)
  if capacity == nil or not (capacity > 0) then
    return nil, redis.error_reply(ERR_CAPACITY)
  end
  if not at_most_max_exact_integer(capacity_text, capacity) then
    return nil, redis.error_reply(ERR_CAPACITY_TOO_LARGE)
  end
  local rate = parse_decimal(rate_text, false)
  if rate == nil or not (rate > 0) then
    return nil, redis.error_reply(ERR_RATE)
  end
  local n = 1
  if n_text ~= nil then
    n = parse_decimal(n_text, false)
    if n == nil then
      return nil, redis.error_reply(ERR_N)
    end
    if not at_most_max_exact_integer(n_text, n) then
      return nil, redis.error_reply(ERR_N_TOO_LARGE)
    end
  end
  return {capacity = capacity, rate = rate, n = n}
end

-- Plain decimal digits (leading zeros allowed; no sign, fraction or
-- exponent), at most 64 bytes, valued from `least` (0 or 1) to 2^53: the
-- value, else nil (core/src/args.rs whole_from). The range is checked on the
-- text, since 64 digits are far beyond a double.
local function parse_whole(text, least)
  if type(text) ~= 'string' or #text == 0 or #text > MAX_LEN
      or not string.match(text, '^%d+$') then
    return nil
  end
  local digits = string.match(text, '^0*(%d*)$')
  if digits == '' then
    if least == 0 then
      return 0
    end
    return nil
  end
  if #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
    return nil
  end
  return tonumber(digits)
end

-- The options of TB.TAKE and TB.TAKEALL by keyword (any case): the field
-- they set, their error and their least value.
local TAKE_OPTIONS = {
  MAXWAIT = {field = 'max_wait', error = ERR_MAXWAIT, least = 0},
  BLOCK = {field = 'block', error = ERR_BLOCK, least = 1},
  MAXBLOCK = {field = 'max_block', error = ERR_MAXBLOCK, least = 1},
}

-- No option given: plain TB.TAKE.
local PLAIN = {max_wait = 0}

-- core/src/args.rs parse_take_options: args[first..] as `MAXWAIT ms`,
-- `BLOCK ms`, `MAXBLOCK ms`, in any order, each at most once, checked in
-- the module's order. Returns {max_wait, block = {block_ms, max_block_ms}
-- or nil}, or (second value) an error reply.
local function parse_take_options(args, first)
  local given = {}
  local i = first
  while i <= #args do
    local name = string.upper(args[i])
    local option = TAKE_OPTIONS[name]
    if option == nil then
      return nil, redis.error_reply(ERR_UNKNOWN_OPTION)
    elseif given[option.field] ~= nil then
      return nil, redis.error_reply(err_repeated_option(name))
    elseif i == #args then
      return nil, redis.error_reply(err_missing_option_value(name))
    end
    local value = parse_whole(args[i + 1], option.least)
    if value == nil then
      return nil, redis.error_reply(option.error)
    end
    given[option.field] = value
    i = i + 2
  end
  local block
  if given.block == nil then
    if given.max_block ~= nil then
      return nil, redis.error_reply(ERR_MAXBLOCK_WITHOUT_BLOCK)
    end
  elseif given.max_block == nil then
    block = {block_ms = given.block, max_block_ms = given.block}
  elseif given.max_block >= given.block then
    block = {block_ms = given.block, max_block_ms = given.max_block}
  else
    return nil, redis.error_reply(ERR_MAXBLOCK)
  end
  return {max_wait = given.max_wait or 0, block = block}
end

-- core/src/args.rs parse_charge_options: args[first..] as `MAXDEBT d`, a
-- number in [0, 2^53], once. Returns d (nil: not given), or (second value)
-- an error reply.
local function parse_charge_options(args, first)
  local count = #args - first + 1
  if count <= 0 then
    return nil
  elseif string.upper(args[first]) ~= 'MAXDEBT' then
    return nil, redis.error_reply(ERR_UNKNOWN_OPTION)
  elseif count == 1 then
    return nil, redis.error_reply(err_missing_option_value('MAXDEBT'))
  elseif count == 2 then
    local debt = parse_decimal(args[first + 1], false)
    if debt == nil or not at_most_max_exact_integer(args[first + 1], debt) then
      return nil, redis.error_reply(ERR_MAXDEBT)
    end
    return debt
  elseif string.upper(args[first + 2]) == 'MAXDEBT' then
    return nil, redis.error_reply(err_repeated_option('MAXDEBT'))
  end
  return nil, redis.error_reply(ERR_UNKNOWN_OPTION)
end

-- The type of `key` as TYPE names it ('none' for a missing key).
local function type_of(key)
  return redis.call('TYPE', key)['ok']
end

-- The value at `key` as `decode(key)` reads it, once `key` is known to hold
-- the type `expected` (the type is checked before any other read, as the
-- module does): nil for a missing key, or (second value) an error reply.
local function read_key(key, expected, decode)
  local kind = type_of(key)
  if kind == 'none' then
    return nil
  elseif kind ~= expected then
    return nil, redis.error_reply(ERR_WRONGTYPE)
  end
  return decode(key)
end

-- A stored lock field as a whole number in [0, 2^53]: a stored number
-- (parse_decimal, signs and exponents allowed, as for `tokens`) without a
-- fraction (src/bucket/hash.rs whole); else nil.
local function stored_whole(text)
  local value = parse_decimal(text, true)
  if value == nil or value ~= math.floor(value)
      or not (value >= 0 and value <= MAX_EXACT_INTEGER) then
    return nil
  end
  return value
end

-- core/src/lockout.rs Lock::from_fields: the lock the three fields' texts
-- make (whole numbers in [0, 2^53], at least one strike, a probation that
-- does not end before the lock), else nil.
local function lock_from_fields(until_text, strikes_text, probation_text)
  local until_ms = stored_whole(until_text)
  local strikes = stored_whole(strikes_text)
  local probation_until = stored_whole(probation_text)
  if until_ms == nil or strikes == nil or probation_until == nil or strikes < 1
      or probation_until < until_ms then
    return nil
  end
  return {until_ms = until_ms, strikes = strikes, probation_until = probation_until}
end

-- The bucket stored at the hash `key`, for read_key: a table
-- {tokens, last_refill, lock}, `lock` the one its fields `locked_until`,
-- `strikes` and `probation_until` hold (nil without `locked_until`; the two
-- others are read only when it is there), or (second value) an error reply.
local function decode_bucket(key)
  local fields = redis.call('HMGET', key, 'tokens', 'last_refill', 'locked_until')
  local tokens = parse_decimal(fields[1], true)
  local last_refill = parse_decimal(fields[2], true)
  if tokens == nil or last_refill == nil then
    return nil, redis.error_reply('ERR corrupt bucket \'' .. show_key(key)
      .. '\': tokens and last_refill must be finite numbers')
  end
  local lock
  if fields[3] then
    local more = redis.call('HMGET', key, 'strikes', 'probation_until')
    lock = lock_from_fields(fields[3], more[1], more[2])
    if lock == nil then
      return nil, redis.error_reply('ERR corrupt bucket \'' .. show_key(key)
        .. '\': locked_until, strikes and probation_until must be whole numbers')
    end
  end
  return {tokens = tokens, last_refill = last_refill, lock = lock}
end

-- The lock stored with `bucket` (nil for a missing key or none stored).
local function lock_of(bucket)
  return bucket and bucket.lock
end

-- The server's clock in ms, read once per call: RedisModule_Milliseconds()
-- is the same sec * 1000 + usec / 1000, rounded down.
local function server_now()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- core/src/bucket.rs seen_at: a missing key is a full bucket; a last_refill
-- later than now (the clock stepped back) counts as now, and is repaired to
-- now by the first write command that sees it, allowed or denied.
local function seen_at(bucket, limit, now)
  if bucket == nil then
    return {tokens = limit.capacity, last_refill = now}, nil
  elseif bucket.last_refill > now then
    local current = {tokens = bucket.tokens, last_refill = now}
    local tokens = available_at(current.tokens, now, limit.capacity, limit.rate, now)
    return current, {tokens = tokens, last_refill = now}
  end
  return bucket, nil
end

-- `state`'s tokens at `now`, and the fewest whole ms until it holds
-- `wanted` (available_at and first_ms_when of a state and a limit).
local function tokens_at(state, limit, now)
  return available_at(state.tokens, state.last_refill, limit.capacity, limit.rate, now)
end

local function wait_for(state, limit, now, wanted)
  return first_ms_when(state.tokens, state.last_refill, limit.capacity, limit.rate, now, wanted)
end

-- core/src/bucket.rs remaining_of: whole tokens, and 0 for a bucket in debt.
local function remaining_of(tokens)
  return math.floor(math.max(tokens, 0))
end

-- core/src/lockout.rs lock_ms: min(block_ms * 2^(strikes - 1), max_block_ms),
-- at least 1; powers of two multiply exactly, so no step overflows.
local function lock_ms(block, strikes)
  local doublings = math.min(math.max(strikes - 1, 0), 62)
  return math.max(math.min(block.block_ms * 2 ^ doublings, block.max_block_ms), 1)
end

-- core/src/lockout.rs start: the lock a denial at `now` starts, the next
-- strike of `previous` if its probation has not ended. Sums past 2^53 round
-- to at least 2^53, which the cap brings back to 2^53, as the module's.
local function start_lock(previous, block, now)
  local strikes = 1
  if previous ~= nil and now < previous.probation_until then
    strikes = math.min(previous.strikes + 1, MAX_EXACT_INTEGER)
  end
  local length = lock_ms(block, strikes)
  local until_ms = math.min(now + length, MAX_EXACT_INTEGER)
  return {until_ms = until_ms, strikes = strikes,
    probation_until = math.min(until_ms + length, MAX_EXACT_INTEGER)}
end

-- core/src/lockout.rs Lock::ms_left.
local function ms_left(lock, now)
  return math.max(lock.until_ms - now, 0)
end

-- core/src/bucket.rs granted: an allowed call that leaves the bucket at
-- `after`; it stores `after` when n > 0, else only a clock repair.
local function granted(after, n, current, repair, limit, now)
  local write = repair
  if n > 0 then
    write = after
  end
  return {allowed = true, remaining = remaining_of(after.tokens), retry = 0,
    reset = wait_for(write or current, limit, now, limit.capacity), write = write}
end

-- core/src/bucket.rs take, with n as given (n = 0: a look). An outcome is
-- the reply's four figures, the state to write (nil: nothing) and the lock
-- to write with it (nil: the lock fields stay as they are).
local function take(bucket, limit, n, now)
  local current, repair = seen_at(bucket, limit, now)
  local available = tokens_at(current, limit, now)
  if available < n then
    -- Denied: nothing written but a clock repair.
    local retry = -1
    if not (n > limit.capacity) then
      retry = wait_for(current, limit, now, n)
    end
    return {allowed = false, remaining = remaining_of(available), retry = retry,
      reset = wait_for(current, limit, now, limit.capacity), write = repair}
  end
  return granted({tokens = available - n, last_refill = now}, n, current, repair, limit, now)
end

-- core/src/bucket.rs reserve: `take` with MAXWAIT, allowed into debt when
-- the missing tokens arrive within `max_wait` ms.
local function reserve(bucket, limit, n, max_wait, now)
  local plain = take(bucket, limit, n, now)
  if plain.allowed or max_wait <= 0 or n > limit.capacity then
    return plain
  end
  local current = seen_at(bucket, limit, now)
  local horizon = now + max_wait
  if tokens_at(current, limit, horizon) < n then
    plain.retry = wait_for(current, limit, horizon, n)
    return plain
  end
  local after = {tokens = tokens_at(current, limit, now) - n, last_refill = now}
  return {allowed = true, remaining = 0,
    retry = math.min(math.max(wait_for(after, limit, now, 0), 1), max_wait),
    reset = wait_for(after, limit, now, limit.capacity), write = after}
end

-- core/src/bucket.rs locked: denied while the lock holds, writing nothing
-- but a clock repair; the wait is the later of the lock's end and the
-- tokens the same call needs.
local function locked(bucket, lock, limit, n, max_wait, now)
  local unlocked = reserve(bucket, limit, n, max_wait, now)
  local tokens_ms = 0
  if not unlocked.allowed then
    tokens_ms = unlocked.retry
  end
  local current, repair = seen_at(bucket, limit, now)
  local retry = -1
  if tokens_ms ~= -1 then
    retry = math.max(tokens_ms, ms_left(lock, now))
  end
  return {allowed = false, remaining = remaining_of(tokens_at(current, limit, now)),
    retry = retry, reset = wait_for(current, limit, now, limit.capacity), write = repair}
end

-- core/src/bucket.rs lock_on_denial: a denial with BLOCK starts a lock and
-- stores it with the bucket as it stands now.
local function lock_on_denial(outcome, bucket, limit, options, now)
  if options.block == nil or outcome.allowed then
    return outcome
  end
  local started = start_lock(lock_of(bucket), options.block, now)
  local current = seen_at(bucket, limit, now)
  local stored = {tokens = tokens_at(current, limit, now), last_refill = now}
  local retry = -1
  if outcome.retry ~= -1 then
    retry = math.max(outcome.retry, ms_left(started, now))
  end
  return {allowed = outcome.allowed, remaining = outcome.remaining, retry = retry,
    reset = wait_for(stored, limit, now, limit.capacity), write = stored, lock = started}
end

-- core/src/bucket.rs take_with: TB.TAKE with its options on `bucket` and the
-- lock it holds. Without options and without a stored lock: `take`.
local function take_with(bucket, limit, n, options, now)
  local lock = lock_of(bucket)
  if lock ~= nil and now < lock.until_ms then
    return locked(bucket, lock, limit, n, options.max_wait, now)
  end
  local outcome = reserve(bucket, limit, n, options.max_wait, now)
  return lock_on_denial(outcome, bucket, limit, options, now)
end

-- core/src/bucket.rs refund: refill, then add n, capped at the capacity.
local function refund(bucket, limit, n, now)
  if bucket == nil then
    return take(nil, limit, 0, now)
  end
  local current, repair = seen_at(bucket, limit, now)
  local after = {tokens = math.min(tokens_at(current, limit, now) + n, limit.capacity),
    last_refill = now}
  return granted(after, n, current, repair, limit, now)
end

-- core/src/bucket.rs debit (TB.CHARGE): takes n whatever the bucket holds,
-- into debt down to -max_debt and no further; a balance already below
-- stays as it is.
local function debit(bucket, limit, n, max_debt, now)
  local current, repair = seen_at(bucket, limit, now)
  local available = tokens_at(current, limit, now)
  local floor = -max_debt
  local tokens = available
  if not (available <= floor) then
    tokens = math.max(available - n, floor)
  end
  local write = repair
  if n > 0 then
    write = {tokens = tokens, last_refill = now}
  end
  local shown = write or current
  return {allowed = true, remaining = remaining_of(tokens_at(shown, limit, now)),
    retry = wait_for(shown, limit, now, 0), reset = wait_for(shown, limit, now, limit.capacity),
    write = write}
end

-- The absolute deadline of a write, as integer text: core/src/bucket.rs
-- deadline_ms, now + max(1, reset) (expire_at_ms), but never before the
-- probation of the lock written, else of the one stored, ends. Both are
-- whole ms; the sum may pass 2^53, the probation never does.
local function deadline_text(outcome, stored_lock, now)
  local full_in = math.max(1, outcome.reset)
  local lock = outcome.lock or stored_lock
  if lock ~= nil and lock.probation_until - now > full_in then
    return string.format('%d', lock.probation_until)
  end
  return add_ms(now, full_in)
end

-- Stores an outcome's write on the bucket `bucket` was read from: one HSET
-- (tokens, last_refill, then the lock the outcome starts, if any), then the
-- absolute deadline (deadline_text), so replicas and a reloaded AOF drop
-- the key at the same ms as the module's. `replace` deletes the key first
-- (a redis-cell string, see tb_throttle).
local function store(key, bucket, outcome, now, replace)
  if outcome.write == nil then
    return
  end
  if replace then
    redis.call('DEL', key)
  end
  local fields = {'tokens', format_tokens(outcome.write.tokens),
    'last_refill', string.format('%d', now)}
  local lock = outcome.lock
  if lock ~= nil then
    fields[5], fields[6] = 'locked_until', string.format('%d', lock.until_ms)
    fields[7], fields[8] = 'strikes', string.format('%d', lock.strikes)
    fields[9], fields[10] = 'probation_until', string.format('%d', lock.probation_until)
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIREAT', key, deadline_text(outcome, lock_of(bucket), now))
end

local function figures(outcome)
  return {outcome.allowed and 1 or 0, outcome.remaining, outcome.retry, outcome.reset}
end

-- One bucket, `key capacity rate n` (n optional where `n_optional`), then
-- what `extra(args)` parses of the arguments after n, if given: the shared
-- start of the single-bucket commands. Checks the arguments, then the key,
-- then reads the clock once. Returns key, request, extra's value, bucket
-- (nil: missing) and now, or (first value nil) an error reply.
local function open_single(command, keys, args, n_optional, max_args, extra)
  local min_args = n_optional and 2 or 3
  if #keys ~= 1 or #args < min_args or (max_args ~= nil and #args > max_args) then
    return nil, arity_error(command)
  end
  local request, err = parse_request(args[1], args[2], args[3])
  if err then
    return nil, err
  end
  local options
  if extra ~= nil then
    options, err = extra(args, 4)
    if err then
      return nil, err
    end
  end
  local bucket, read_err = read_key(keys[1], 'hash', decode_bucket)
  if read_err then
    return nil, read_err
  end
  return {key = keys[1], request = request, options = options, bucket = bucket,
    now = server_now()}
end

-- TB.TAKE key capacity rate n [MAXWAIT ms] [BLOCK ms [MAXBLOCK ms]]
local function tb_take(keys, args)
  local call, err = open_single('tb.take', keys, args, false, nil, parse_take_options)
  if err then
    return err
  end
  local outcome = take_with(call.bucket, call.request, call.request.n, call.options, call.now)
  store(call.key, call.bucket, outcome, call.now)
  return figures(outcome)
end

-- TB.PEEK key capacity rate [n]: what TB.TAKE would reply; writes nothing.
local function tb_peek(keys, args)
  local call, err = open_single('tb.peek', keys, args, true, 3, nil)
  if err then
    return err
  end
  return figures(take_with(call.bucket, call.request, call.request.n, PLAIN, call.now))
end

-- TB.REFUND key capacity rate n
local function tb_refund(keys, args)
  local call, err = open_single('tb.refund', keys, args, false, 3, nil)
  if err then
    return err
  end
  local outcome = refund(call.bucket, call.request, call.request.n, call.now)
  store(call.key, call.bucket, outcome, call.now)
  return figures(outcome)
end

-- TB.CHARGE key capacity rate n [MAXDEBT d]: always allowed, into debt down
-- to -d (d defaults to the capacity).
local function tb_charge(keys, args)
  local call, err = open_single('tb.charge', keys, args, false, nil, parse_charge_options)
  if err then
    return err
  end
  local max_debt = call.options or call.request.capacity
  local outcome = debit(call.bucket, call.request, call.request.n, max_debt, call.now)
  store(call.key, call.bucket, outcome, call.now)
  return figures(outcome)
end

-- TB.TAKEALL: every bucket or none (core/src/bucket.rs take_all). Keys come as
-- KEYS, the numbers as capacity rate n per key, in the keys' order, then
-- the options (MAXWAIT, BLOCK, MAXBLOCK), which apply to every bucket.
local function tb_takeall(keys, args)
  if #keys == 0 or #args < 3 * #keys then
    return arity_error('tb.takeall')
  end
  local requests = {}
  for i = 1, #keys do
    local request, err = parse_request(args[3 * i - 2], args[3 * i - 1], args[3 * i])
    if err then
      return err
    end
    requests[i] = request
  end
  local options, options_err = parse_take_options(args, 3 * #keys + 1)
  if options_err then
    return options_err
  end
  local seen = {}
  for i = 1, #keys do
    if seen[keys[i]] then
      return redis.error_reply(ERR_DUPLICATE)
    end
    seen[keys[i]] = true
  end
  local buckets = {}
  for i = 1, #keys do
    local bucket, read_err = read_key(keys[i], 'hash', decode_bucket)
    if read_err then
      return read_err
    end
    buckets[i] = bucket
  end
  local now = server_now()
  local outcomes = {}
  local allowed = true
  for i = 1, #keys do
    outcomes[i] = take_with(buckets[i], requests[i], requests[i].n, options, now)
    allowed = allowed and outcomes[i].allowed
  end
  if not allowed then
    -- Nothing is taken anywhere: a bucket that would have allowed is
    -- answered as a look (n = 0), which writes only a clock repair.
    for i = 1, #keys do
      if outcomes[i].allowed then
        outcomes[i] = take(buckets[i], requests[i], 0, now)
      end
    end
  end
  -- The deciding bucket, by (wait, tokens short) compared in that order:
  -- when denied the longest wait (-1, never, longest of all); when allowed
  -- the longest reservation wait, then the fewest tokens left. Ties go to
  -- the first.
  local decisive, heaviest, heaviest_then = 1, nil, nil
  for i = 1, #keys do
    local weight, weight_then = outcomes[i].retry, 0
    if allowed then
      weight_then = -outcomes[i].remaining
    elseif weight < 0 then
      weight = math.huge
    end
    if heaviest == nil or weight > heaviest
        or (weight == heaviest and weight_then > heaviest_then) then
      decisive, heaviest, heaviest_then = i, weight, weight_then
    end
  end
  for i = 1, #keys do
    store(keys[i], buckets[i], outcomes[i], now)
  end
  local reply = figures(outcomes[decisive])
  reply[5] = decisive - 1
  return reply
end

-- TB.UNBLOCK key: removes the key's lock and its strikes (1), or does
-- nothing if it has none (0); the tokens and the TTL stay as they are.
local function tb_unblock(keys, args)
  if #keys ~= 1 or #args ~= 0 then
    return arity_error('tb.unblock')
  end
  local kind = type_of(keys[1])
  if kind == 'none' then
    return 0
  elseif kind ~= 'hash' then
    return redis.error_reply(ERR_WRONGTYPE)
  end
  -- HDEL writes (and replicates) nothing when none of the fields is there.
  if redis.call('HDEL', keys[1], 'locked_until', 'strikes', 'probation_until') > 0 then
    return 1
  end
  return 0
end

-- core/src/throttle.rs parse_tat: a redis-cell value, an integer (its TAT
-- in ns) that fits an i64; nil for anything else. Read as a double, the
-- nearest to it, as the module's `as f64`.
local function parse_tat(text)
  local digits = string.match(text, '^%-?(%d+)$')
  if digits == nil or #digits > 19
      or (#digits == 19 and digits > '9223372036854775807') then
    return nil
  end
  return tonumber(text)
end

-- core/src/throttle.rs from_cell: the bucket a redis-cell key stands for,
-- refilled to now, in the same double operations.
local function from_cell(tat_ns, limit, now)
  -- Read against the end of this millisecond, as the module does.
  local ahead = math.max((tat_ns - 999999) / 1e6 - now, 0)
  local used = ahead / 1000 * limit.rate
  return {tokens = math.min(limit.capacity - used, limit.capacity), last_refill = now}
end

-- Whole seconds of `ms`, truncated (ms >= 0; exact where ms / 1000 in
-- doubles may round up to the next second).
local function seconds(ms)
  return (ms - math.fmod(ms, 1000)) / 1000
end

-- TB.THROTTLE key max_burst count period [quantity]: redis-cell's
-- arguments and reply (core/src/throttle.rs) on the bucket of capacity
-- max_burst + 1 refilled at count / period per second, judged as TB.TAKE.
-- A key holding redis-cell's string is read as the bucket it stands for,
-- and its first write replaces it by the hash.
local function tb_throttle(keys, args)
  if #keys ~= 1 or #args < 3 or #args > 4 then
    return arity_error('tb.throttle')
  end
  local max_burst = parse_whole(args[1], 0)
  if max_burst == nil or not (max_burst < MAX_EXACT_INTEGER) then
    return redis.error_reply(ERR_MAX_BURST)
  end
  local count = parse_whole(args[2], 1)
  if count == nil then
    return redis.error_reply(ERR_THROTTLE_COUNT)
  end
  local period = parse_whole(args[3], 1)
  if period == nil then
    return redis.error_reply(ERR_PERIOD)
  end
  local n = 1
  if args[4] ~= nil then
    n = parse_whole(args[4], 0)
    if n == nil then
      return redis.error_reply(ERR_QUANTITY)
    end
  end
  local limit = {capacity = max_burst + 1, rate = count / period}
  local key = keys[1]
  local kind = type_of(key)
  local bucket, tat, err
  if kind == 'hash' then
    bucket, err = decode_bucket(key)
    if err then
      return err
    end
  elseif kind == 'string' then
    tat = parse_tat(redis.call('GET', key))
    if tat == nil then
      return redis.error_reply(ERR_WRONGTYPE)
    end
  elseif kind ~= 'none' then
    return redis.error_reply(ERR_WRONGTYPE)
  end
  local now = server_now()
  if tat ~= nil then
    bucket = from_cell(tat, limit, now)
  end
  local outcome = take_with(bucket, limit, n, PLAIN, now)
  store(key, bucket, outcome, now, tat ~= nil)
  local retry_s = -1
  if not outcome.allowed and outcome.retry >= 0 then
    retry_s = seconds(outcome.retry)
  end
  return {outcome.allowed and 0 or 1, limit.capacity, outcome.remaining, retry_s,
    seconds(outcome.reset)}
end

-- Leases (docs/leases.md): TB.ACQUIRE, TB.RELEASE and TB.RENEW. The key is a
-- sorted set: one member per lease, its id `<ms>-<n>-<incarnation>` scored by
-- its deadline (Unix ms), `seq` scored by minus the count of ids handed out,
-- and `inc` scored by minus the set's incarnation, drawn when the set is made
-- (a set made before incarnations has no `inc`, and its ids are `<ms>-<n>`).
-- Scores and ms are whole numbers <= 2^53, exact in doubles, and reach the
-- server as '%d' text, so ZADD and PEXPIREAT get the module's numbers exactly.

-- How many expired leases one writing call removes, earliest first.
local EXPIRED_PER_CALL = 64

local ERR_LIMIT = 'ERR limit must be a positive integer, at most 9007199254740992 (2^53)'
local ERR_LEASE_MS =
  'ERR lease_ms must be a positive integer number of ms, at most 9007199254740992 (2^53)'
local ERR_EXHAUSTED = 'ERR tb: this lease set has handed out 2^53 ids; delete it to start again'

-- Plain decimal digits (leading zeros allowed; no sign, fraction or
-- exponent), at most 64 bytes, from 1 to 2^53: the value, else nil. The
-- range is checked on the text, since 64 digits are far beyond a double.
local function parse_positive_integer(text)
  if type(text) ~= 'string' or #text == 0 or #text > MAX_LEN
      or not string.match(text, '^%d+$') then
    return nil
  end
  local digits = string.match(text, '^0*(%d*)$')
  if digits == '' or #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
    return nil
  end
  return tonumber(digits)
end

local function fmt_int(x)
  return string.format('%d', x)
end

-- The lease set at the sorted set `key`, for read_key: the count of ids it
-- has handed out; or (second value) an error reply.
local function decode_leases(key)
  local score = tonumber(redis.call('ZSCORE', key, 'seq'))
  if score == nil or not (score >= -MAX_EXACT_INTEGER and score <= 0) or score ~= math.floor(score) then
    return nil, redis.error_reply('ERR corrupt lease set \'' .. show_key(key)
      .. '\': no seq member scored from -2^53 to 0')
  end
  return -score
end

-- The incarnation of the existing lease set `key`: minus the `inc` member's
-- score when that is a whole number in [-2^53, -1], else nil (no `inc`, or
-- one scored otherwise: the set hands out ids as one made before
-- incarnations), as core/src/lease.rs Incarnation::from_score reads it.
local function stored_incarnation(key)
  local score = tonumber(redis.call('ZSCORE', key, 'inc'))
  if score == nil or not (score >= -MAX_EXACT_INTEGER and score <= -1)
      or score ~= math.floor(score) then
    return nil
  end
  return -score
end

-- A new lease set's incarnation, in [1, 2^53]. The module draws it from the
-- server's random source (RM_GetRandomBytes), which a script cannot reach,
-- and math.random cannot stand in: the server seeds it with a constant at
-- startup, so a restarted server, or a promoted replica, draws the same
-- numbers again. So here the incarnation is 53 bits of the SHA1 of
-- * INFO server, whose run_id is 160 random bits the process drew from
--   /dev/urandom at startup: another after a restart, and on every other
--   server (a replica promoted in a failover has its own);
-- * INFO stats, whose total_commands_processed grows with every command
--   the process runs, so no two calls of one process hash the same text,
--   whatever the clock does (short of CONFIG RESETSTAT, which resets it);
-- * TIME, to the microsecond.
-- Each is read, never written, so the draw replicates as nothing but the
-- ZADD that stores its result (effects replication): replicas and the AOF
-- keep the master's incarnation and never draw their own.
local function new_incarnation()
  local time = redis.call('TIME')
  local digest = redis.sha1hex(redis.call('INFO', 'server') .. '\n'
    .. redis.call('INFO', 'stats') .. '\n' .. time[1] .. '.' .. time[2])
  -- 25 + 28 bits, each exact in a double, then 1 to 2^53.
  local high = tonumber(string.sub(digest, 1, 7), 16) % 33554432
  local low = tonumber(string.sub(digest, 8, 14), 16)
  return high * 268435456 + low + 1
end

-- The key's expiry as an absolute ms: -1 none, -2 no key. PEXPIRETIME is
-- Redis 7+ and Valkey; before it, PTTL from `now` (possibly a ms off).
local function expire_time(key, now)
  local at = redis.pcall('PEXPIRETIME', key)
  if type(at) == 'number' then
    return at
  elseif not string.find(tostring(at.err), 'nknown', 1, true) then
    return error(at) -- not a missing command (NOPERM, say): fail as call would
  end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then
    return ttl
  end
  return now + ttl
end

-- The expiry after a write of `deadline`: it only grows. A key without one
-- (PERSIST by hand) gets the latest deadline it holds, or `deadline`.
-- Called before the write; PEXPIREAT only when the expiry grows.
local function extend_expiry(key, deadline, now)
  local at = expire_time(key, now)
  if at == -1 then
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local highest = tonumber(top[2])
    if highest ~= nil and math.ceil(highest) > deadline then
      deadline = math.ceil(highest)
    end
    return deadline
  elseif at >= deadline then
    return nil
  end
  return deadline
end

-- The ids of at most EXPIRED_PER_CALL leases ended by `now`, earliest
-- first: deadlines in (0, now], which never includes `seq`.
local function expired_leases(key, now)
  return redis.call('ZRANGEBYSCORE', key, '(0', fmt_int(now), 'LIMIT', 0, EXPIRED_PER_CALL)
end

-- now + lease_ms, capped at 2^53 (exact: both are integers <= 2^53, and a
-- sum past 2^53 rounds to at least 2^53).
local function deadline_of(now, lease_ms)
  return math.min(now + lease_ms, MAX_EXACT_INTEGER)
end

-- Stores a lease's deadline (ZADD `members`, a list of score, member) after
-- removing expired leases (and `also`, a member to remove, if any).
local function write_leases(key, now, deadline, members, also)
  local expiry = deadline and extend_expiry(key, deadline, now)
  local expired = expired_leases(key, now)
  if also ~= nil then
    expired[#expired + 1] = also
  end
  if #expired > 0 then
    redis.call('ZREM', key, unpack(expired))
  end
  if members ~= nil then
    redis.call('ZADD', key, unpack(members))
  end
  if expiry ~= nil then
    redis.call('PEXPIREAT', key, fmt_int(expiry))
  end
end

-- The lease `lease` at `key` if it is live at `now`: its deadline (whole ms,
-- rounded up as the module reads a score), else nil. Only members shaped like
-- an id, two or three groups of digits joined by dashes (`<ms>-<n>`,
-- `<ms>-<n>-<incarnation>`) of at most 64 bytes, are looked up, so no
-- argument can touch `seq`, `inc` or a member someone else stored.
local function live_deadline(key, lease, now)
  if #lease > MAX_LEN or not (string.match(lease, '^%d+%-%d+$')
      or string.match(lease, '^%d+%-%d+%-%d+$')) then
    return nil
  end
  local score = tonumber(redis.call('ZSCORE', key, lease))
  if score ~= nil and now < math.ceil(score) then
    return math.ceil(score)
  end
  return nil
end

-- The arguments that are positive integers, and the error for each.
local LEASE_INTEGER_ERRORS = {limit = ERR_LIMIT, lease_ms = ERR_LEASE_MS}

-- The shared start of TB.ACQUIRE, TB.RELEASE and TB.RENEW, checked in the
-- module's order: the arity, the arguments `names` one by one, the key's type,
-- then the clock, read once. Returns a table of the arguments by name, `key`,
-- `count` (of ids handed out; nil for a missing key) and `now`; or nil and an
-- error reply.
local function open_leases(command, keys, args, names)
  if #keys ~= 1 or #args ~= #names then
    return nil, arity_error(command)
  end
  local call = {key = keys[1]}
  for i, name in ipairs(names) do
    local value = args[i]
    local integer_error = LEASE_INTEGER_ERRORS[name]
    if integer_error ~= nil then
      value = parse_positive_integer(value)
      if value == nil then
        return nil, redis.error_reply(integer_error)
      end
    end
    call[name] = value
  end
  local count, err = read_key(call.key, 'zset', decode_leases)
  if err then
    return nil, err
  end
  call.count = count
  call.now = server_now()
  return call
end

-- TB.ACQUIRE key limit lease_ms (no timeout_ms: a script cannot wait).
local function tb_acquire(keys, args)
  local call, err = open_leases('tb.acquire', keys, args, {'limit', 'lease_ms'})
  if err then
    return err
  end
  local key, now, limit = call.key, call.now, call.limit
  local live = 0
  if call.count ~= nil then
    live = redis.call('ZCOUNT', key, '(' .. fmt_int(now), '+inf')
  end
  if live >= limit then
    -- Denied (live >= limit >= 1, so a live lease exists): nothing written.
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. fmt_int(now), '+inf', 'WITHSCORES',
      'LIMIT', 0, 1)
    return {0, 0, math.ceil(tonumber(first[2])) - now, false}
  end
  local count = call.count or 0
  if count >= MAX_EXACT_INTEGER then
    return redis.error_reply(ERR_EXHAUSTED)
  end
  local n = count + 1
  -- The grant that makes the set draws its incarnation and stores it, in the
  -- same ZADD, after `seq` (as the module does).
  local incarnation
  if call.count == nil then
    incarnation = new_incarnation()
  else
    incarnation = stored_incarnation(key)
  end
  local id = fmt_int(now) .. '-' .. fmt_int(n)
  if incarnation ~= nil then
    id = id .. '-' .. fmt_int(incarnation)
  end
  local deadline = deadline_of(now, call.lease_ms)
  local members = {fmt_int(deadline), id, fmt_int(-n), 'seq'}
  if call.count == nil then
    members[5] = fmt_int(-incarnation)
    members[6] = 'inc'
  end
  write_leases(key, now, deadline, members, nil)
  return {1, limit - live - 1, 0, id}
end

-- The shared path of TB.RELEASE and TB.RENEW (they differ only in the
-- write): 0, writing nothing, if the set is missing or `lease` is not live;
-- else 1, after removing the lease or, given `lease_ms`, moving its deadline
-- to lease_ms from now.
local function release_or_renew(command, keys, args, names)
  local call, err = open_leases(command, keys, args, names)
  if err then
    return err
  end
  local key, lease, now = call.key, call.lease, call.now
  if call.count == nil or live_deadline(key, lease, now) == nil then
    return 0
  end
  if call.lease_ms == nil then
    write_leases(key, now, nil, nil, lease)
  else
    local deadline = deadline_of(now, call.lease_ms)
    write_leases(key, now, deadline, {fmt_int(deadline), lease}, nil)
  end
  return 1
end

-- TB.RELEASE key lease
local function tb_release(keys, args)
  return release_or_renew('tb.release', keys, args, {'lease'})
end

-- TB.RENEW key lease lease_ms
local function tb_renew(keys, args)
  return release_or_renew('tb.renew', keys, args, {'lease', 'lease_ms'})
end

if redis.register_function then
  -- FUNCTION LOAD: writers are registered without flags, like any function
  -- that writes: refused by FCALL_RO, on a read-only replica and (like the
  -- module's deny-oom commands) over maxmemory.
  redis.register_function('tb_take', tb_take)
  redis.register_function{function_name = 'tb_peek', callback = tb_peek, flags = {'no-writes'}}
  redis.register_function('tb_refund', tb_refund)
  redis.register_function('tb_takeall', tb_takeall)
  redis.register_function('tb_charge', tb_charge)
  redis.register_function('tb_throttle', tb_throttle)
  -- Like TB.UNBLOCK: it only deletes, so it runs when memory is short.
  redis.register_function{function_name = 'tb_unblock', callback = tb_unblock,
    flags = {'allow-oom'}}
  redis.register_function('tb_acquire', tb_acquire)
  -- Like TB.RELEASE and TB.RENEW (no deny-oom): a holder can give its lease
  -- back, or keep it, when memory is short.
  redis.register_function{function_name = 'tb_release', callback = tb_release,
    flags = {'allow-oom'}}
  redis.register_function{function_name = 'tb_renew', callback = tb_renew, flags = {'allow-oom'}}
else
  -- EVAL: a write after TIME needs effects replication, the default since
  -- Redis 5; Redis 4 gets it from this call.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local commands = {take = tb_take, peek = tb_peek, refund = tb_refund, takeall = tb_takeall,
    charge = tb_charge, unblock = tb_unblock, throttle = tb_throttle,
    acquire = tb_acquire, release = tb_release, renew = tb_renew}
  local command = commands[ARGV[1]]
  if command == nil then
    return redis.error_reply('ERR the first argument must be take, peek, refund, takeall, '
      .. 'charge, unblock, throttle, acquire, release or renew')
  end
  return command(KEYS, {unpack(ARGV, 2)})
end
