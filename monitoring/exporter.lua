-- redis-tb's series for prometheus-redis-exporter: run it with
--   prometheus-redis-exporter -redis.addr redis://HOST:PORT -script exporter.lua
-- and each pair below becomes redis_script_values{key="NAME"} (the exporter runs the script
-- with EVAL on every scrape, reads the reply as NAME, VALUE pairs, and gives up on the rest of
-- the reply at the first VALUE that is not a number: so every value here is one).
--
-- * Every numeric field of INFO tb, under its own name (tb_calls, tb_denied, ...).
--   tb_clock, the one text field, becomes tb_clock_cached: 1 for the server's cached command
--   time, 0 for the wall clock.
-- * The keys TB.TOP lists (COUNT 10), as tb_top_denied:<key> with the key's count, so no key
--   name can take the place of a counter. Bytes outside printable ASCII, and the backslash,
--   are written \xNN: every name is valid UTF-8, none is dropped.
-- * tb_top_available: 1 if TB.TOP answered (0: a module without it, or a user not granted it).
local out = {}

local function pair(name, value)
  out[#out + 1] = name
  out[#out + 1] = tostring(value)
end

local info = redis.call('INFO', 'tb')
for name, value in string.gmatch(info, '(tb_[%w_]+):([^\r\n]*)') do
  if name == 'tb_clock' then
    pair('tb_clock_cached', value == 'cached' and 1 or 0)
  elseif tonumber(value) ~= nil then
    pair(name, value)
  end
end

local function escaped(key)
  return (string.gsub(key, '.', function(char)
    local byte = string.byte(char)
    if byte < 32 or byte > 126 or byte == 92 then
      return string.format('\\x%02X', byte)
    end
  end))
end

local answered, rows = pcall(redis.call, 'TB.TOP', 'COUNT', '10')
if answered and type(rows) == 'table' then
  pair('tb_top_available', 1)
  for _, row in ipairs(rows) do
    pair('tb_top_denied:' .. escaped(row[1]), row[2])
  end
else
  pair('tb_top_available', 0)
end

return out
