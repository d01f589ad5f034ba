--[[ queue_pause: stop the queue's claims until queue_resume. Every claim leases nothing while
  the queue's `config` hash holds `paused_ms` (the server time it was paused); enqueues are
  still accepted, leases already held run, heartbeat and settle as usual, and claims still reap
  lapsed leases (a lapsed job waits in due like the rest).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): config, partitions
  Returns: 'paused' | 'already' (it was: paused_ms kept, nothing written)
  Errors:  BAD_ARGUMENT queue=<name> is partitioned (its own name: nothing written); CORRUPT config is not a hash (edited by hand; nothing written); the server's own
    refusal of the write (OOM, READONLY, NOREPLICAS, ...) as it came, nothing written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end
-- A partitioned queue's own name: its partitions hold its jobs (scheduler.open_queue acts on them).
local parted = partitioned_err(KEYS[1]); if parted then return parted end

local cfg = KEYS[1] .. 'config'
local set = redis.pcall('HSETNX', cfg, 'paused_ms', fmt(now_ms()))
local refused = write_refused(set, 'config', 'hash')
if refused then return refused end
if set == 0 then return 'already' end
return 'paused'
