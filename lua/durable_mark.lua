--[[ durable_mark: one write for a WAIT to count from, when an enqueue under `wait_replicas`
  wrote nothing (every job of it already there: a re-send after NotDurable, by job_id or by
  idempotency key). WAIT counts the connection's own last write, which did not cover those
  jobs; this write comes after them in the replication stream, so a replica that acknowledges
  it has them (scheduler/operations/producing.py, docs/durability.md).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): config, durable_mark
  ARGV: none
  Returns: 'ok'. The key is set and deleted in the same call (both replicated): nothing stays.
  Errors:  NEWER_STORAGE (lib/util.lua newer_storage_err); the server's own refusal of the write
    (OOM, READONLY, NOREPLICAS, ...) as it came, nothing written ]]
-- @include "lib/util.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local mark = KEYS[1] .. 'durable_mark'
redis.call('SET', mark, '1')
redis.call('DEL', mark)
return 'ok'
