--[[ worker_beat: refresh (or remove) one live worker's entry, read by `scheduler workers`,
  and hand it the stop an operator asked for (`scheduler workers stop|quiet`, the dashboard).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): workers, worker:<id>, worker_stop:<id>
  ARGV[1] worker id   ARGV[2] ttl_ms (> 0; the hash expires after it: a dead worker drops out)
  ARGV[3] mode 'beat' | 'remove'
  ARGV[4] host  ARGV[5] pid  ARGV[6] queues (comma-separated)  ARGV[7] in_flight
  ARGV[8] concurrency  ARGV[9] (optional) the stop the worker is carrying out: '' | 'quiet' |
    'stop', shown as the hash's `stopping` field
  Writes: ZSET prefix..'workers' id -> last_seen_ms; HASH prefix..'worker:'..id with host, pid,
    queues, started_ms (the first beat of this host and pid), last_heartbeat_ms, in_flight,
    concurrency, stopping ('' or ARGV[9], or the request read now). Entries not seen for 10
    ttls are pruned from the ZSET, which itself expires 10 ttls after the last beat (a killed
    last worker never removes its entry).
    'beat' reads and deletes STRING prefix..'worker_stop:'..id (an operator's request, 'quiet'
    or 'stop', written with an expiry by scheduler/admin/worker_stop.py); 'remove' removes the
    entry and a request left for it only while its host and pid are the caller's (another
    process may have taken the id).
  Returns: {now_ms, request} where request is 'quiet', 'stop' or '' (none, or not one of these)
  Errors:  BAD_ARGUMENT <field>=<value>; a refusal of its first write (OOM). A key of it edited
    by hand into another type is written around (pcall): the entry is only a listing. ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"

local prefix = KEYS[1]
local id, mode = ARGV[1], ARGV[3]
local ttl, err = int_arg(ARGV[2], 'ttl_ms', 1, LIM.ttl_ms)
if err then return err end
if id == '' then return redis.error_reply('BAD_ARGUMENT worker=') end
local zkey, hkey = prefix .. 'workers', prefix .. 'worker:' .. id
local skey = prefix .. 'worker_stop:' .. id
local now = now_ms()
-- pcall throughout: the entry is a listing for `scheduler workers` alone, so a key of it edited
-- by hand into another type must not stop a worker that beats (its jobs' leases are elsewhere).
if mode == 'remove' then
  -- Only this process's entry: a process started with the same id (a pool's reload starts the
  -- replacement before the old one stops) has written its own by now.
  local owner = redis.pcall('HMGET', hkey, 'host', 'pid')
  if type(owner) == 'table' and not owner.err and owner[2]
      and (owner[1] ~= ARGV[4] or owner[2] ~= ARGV[5]) then
    return {fmt(now), ''}
  end
  redis.pcall('ZREM', zkey, id)
  redis.pcall('DEL', hkey, skey)
  return {fmt(now), ''}
end
if mode ~= 'beat' then return redis.error_reply('BAD_ARGUMENT mode=' .. mode) end
-- The first write: a full server's refusal (OOM) is still the caller's error to back off from.
local first = redis.pcall('ZADD', zkey, now, id)
if type(first) == 'table' and not string.find(first.err, 'WRONGTYPE', 1, true) then
  return first
end
-- The request is the worker's once read: deleted, so a process started later under the same id
-- (a fixed --worker-id restarted by its service manager) is not stopped by it too.
local asked = redis.pcall('GET', skey)
if asked == 'quiet' or asked == 'stop' then
  redis.pcall('DEL', skey)
else
  asked = ''  -- none, another type or another word (by hand): left to expire as it is
end
local stopping = ARGV[9] or ''
if asked == 'stop' or (asked == 'quiet' and stopping == '') then stopping = asked end
-- Another process under this id (a fixed --worker-id, a pool's `<id>.<k>`, restarted before
-- the hash expired): its own start, or a crash loop reads as a long uptime.
local was = redis.pcall('HMGET', hkey, 'host', 'pid')
if type(was) == 'table' and not was.err and was[2]
    and (was[1] ~= ARGV[4] or was[2] ~= ARGV[5]) then
  redis.pcall('HSET', hkey, 'started_ms', fmt(now))
else
  redis.pcall('HSETNX', hkey, 'started_ms', fmt(now))
end
redis.pcall('HSET', hkey, 'host', ARGV[4], 'pid', ARGV[5], 'queues', ARGV[6],
  'last_heartbeat_ms', fmt(now), 'in_flight', ARGV[7], 'concurrency', ARGV[8],
  'stopping', (stopping == 'quiet' or stopping == 'stop') and stopping or '')
redis.pcall('PEXPIRE', hkey, ttl)
redis.pcall('ZREMRANGEBYSCORE', zkey, '-inf', now - 10 * ttl)
-- Not on a key of another type: that one is left for an operator as it is.
if type(first) == 'number' then redis.pcall('PEXPIRE', zkey, 10 * ttl) end
return {fmt(now), asked}
