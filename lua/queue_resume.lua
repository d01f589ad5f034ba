--[[ queue_resume: end a queue_pause. Claims lease again, and idle workers are woken at once
  (lib/util.lua wake) instead of at their idle safety net.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): config, partitions
  Returns: 'resumed' | 'active' (was not paused: nothing written)
  Errors:  BAD_ARGUMENT queue=<name> is partitioned (its own name: nothing written); CORRUPT config is not a hash (edited by hand; nothing written); the server's own
    refusal of the write (OOM, READONLY, NOREPLICAS, ...) as it came, nothing written ]]
-- @include "lib/util.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end
-- A partitioned queue's own name: its partitions hold its jobs (scheduler.open_queue acts on them).
local parted = partitioned_err(KEYS[1]); if parted then return parted end

local cfg, wake_key = KEYS[1] .. 'config', KEYS[5]
local gone = redis.pcall('HDEL', cfg, 'paused_ms')
local refused = write_refused(gone, 'config', 'hash')
if refused then return refused end
if gone == 0 then return 'active' end
wake(wake_key)
return 'resumed'
