-- Test-only clock, swapped in for lib/clock.lua by the test seam in scheduler/scripts.py.
-- Production scripts never contain this text, so it cannot be switched on by accident.
-- Reads <prefix>test:now_ms (KEYS[1] is the queue prefix in every script); falls back to TIME.
local function now_ms()
  local v = redis.call('GET', KEYS[1] .. 'test:now_ms')
  if v then return tonumber(v) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
