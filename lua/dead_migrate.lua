--[[ dead_migrate: one bounded step of converting a dead LIST (older versions) into the dead
  ZSET (lib/job.lua dead_migrate). Clients that page the dead key call it until it returns 0.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, dead:migrating, config
  ARGV none
  Returns: the number of ids still on the old LIST (0: the dead key is a ZSET or absent). ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

return dead_migrate(KEYS[1], now_ms())
