-- The only clock: the Redis server's TIME, in integer milliseconds.
-- Worker clocks are never trusted for due or lease decisions.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
