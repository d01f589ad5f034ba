-- Exact integer formatting: tostring() switches to exponent notation past 14 digits.
local function fmt(n)
  return string.format('%.0f', n)
end

-- Every ARGV number is checked before the first write (Redis keeps writes made before an error).
local function int_arg(v, name, min)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or (min ~= nil and n < min) then
    return nil, redis.error_reply('BAD_ARGUMENT ' .. name .. '=' .. tostring(v))
  end
  return n
end

-- ARGV[from..] as integers, checked together before any write.
local function int_args(from, name)
  local out = {}
  for i = from, #ARGV do
    local v, err = int_arg(ARGV[i], name, nil)
    if err then return nil, err end
    out[#out + 1] = v
  end
  return out
end

-- Per-minute outcome counters, read by `scheduler stats`; kept two hours.
local function bump_stat(prefix, now, field, n)
  if n <= 0 then return end
  local k = prefix .. 'stats:' .. fmt(math.floor(now / 60000))
  redis.call('HINCRBY', k, field, n)
  redis.call('PEXPIRE', k, 7200000)
end

-- Tell idle workers something became due earlier than they planned; the list stays tiny.
local function wake(wake_key)
  redis.call('LPUSH', wake_key, '1')
  redis.call('LTRIM', wake_key, 0, 7)
end
