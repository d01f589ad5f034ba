--[[ move_done: the last step of moving waiting jobs (move_out.lua, move_in.lua): the jobs the
  other queue now holds leave this queue's `moving` set and their records here are deleted.
  Only ids still in `moving` are touched: a re-sent call deletes nothing more.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, config, moving, move_lock, move_in:<source>
  ARGV[1] 'done' (each id one the destination answered 'c' or 'e' for: its records deleted)
    | 'back' (the destination holds another job under the id, 'x': it goes back into due at
    its run time, where it was), then the run's lock token ('' = a caller holding no lock),
    then ids (1 .. MAX_IDS): refused, nothing written, unless the run lock (`move_lock`)
    names that token or, for '', no lock is there (lib/util.lua move_lock_err): a run that
    lost its lock between its put and its finish would delete a job another run re-sends
    | 'end' then the destination queue's name (the run is over: its record in config,
    `move_to` and `move_take_ms` (move_out.lua), is deleted if `moving` is empty and it names
    that destination: another run's record, or jobs still to re-send, are kept)
    | 'renew' then the run's token and its lease in ms (the run lock, `move_lock` built from the
    prefix, scheduler/admin/queue_move_lock.py: its expiry starts again only while its JSON
    value names that token) | 'unlock' then the token (deleted only while it names it)
    | 'forget' then a `move_from:<source>` field of config and the value a check read there
    (a record that move left behind, scheduler/admin/queue_move_check.py: deleted only while
    it holds that value, with that move's `move_in:<source>` ids (move_in.lua); a move into
    this queue since wrote a new one, which stays)
  Returns: how many left `moving`; 'end': 1 if the record was deleted, else 0; 'renew': 1, or
    the lock's value when it names another token ('' when none); 'unlock', 'forget': 1 if
    deleted, else 0
  Errors:  BAD_ARGUMENT <field>=<value>; MOVE_LOCKED holder=<the lock's value> ('done',
    'back': above); CORRUPT moving is not a zset (edited by hand; nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix = KEYS[1]
local moving = prefix .. 'moving'
local MAX_IDS = 1000  -- scheduler/admin/queue_move.py MOVE_PER_CALL
local mode = table.remove(ARGV, 1)
if mode ~= 'done' and mode ~= 'back' and mode ~= 'end' and mode ~= 'renew' and mode ~= 'unlock'
    and mode ~= 'forget' then
  return redis.error_reply('BAD_ARGUMENT mode=' .. string.sub(tostring(mode), 1, 40))
end
if mode == 'forget' then  -- compare, then delete
  local cfg, field, value = prefix .. 'config', ARGV[1], ARGV[2]
  if #ARGV ~= 2 or string.sub(field, 1, 10) ~= 'move_from:' then
    return redis.error_reply('BAD_ARGUMENT field=' .. string.sub(tostring(field), 1, 40))
  end
  local err = key_type_err(cfg, 'config', 'hash')
  if err then return err end
  if redis.call('HGET', cfg, field) ~= value then return 0 end
  local refused = write_refused(redis.pcall('HDEL', cfg, field), 'config', 'hash')
  if refused then return refused end
  redis.call('DEL', prefix .. 'move_in:' .. string.sub(field, 11))
  return 1
end
if mode == 'renew' or mode == 'unlock' then  -- the run lock: compare, then renew or delete
  local lock, token = prefix .. 'move_lock', ARGV[1]
  local lease = mode == 'renew' and parse_int(ARGV[2], 1, 86400000)
  if type(token) ~= 'string' or token == '' or #ARGV ~= (mode == 'renew' and 2 or 1)
      or (mode == 'renew' and not lease) then
    return redis.error_reply('BAD_ARGUMENT n=' .. #ARGV)
  end
  local value = redis.pcall('GET', lock)
  if type(value) ~= 'string' then return mode == 'renew' and '' or 0 end  -- none, or edited
  local ok, info = pcall(cjson.decode, value)
  if not ok or type(info) ~= 'table' or info.token ~= token then
    return mode == 'renew' and value or 0
  end
  if mode == 'unlock' then return redis.call('DEL', lock) end
  redis.call('PEXPIRE', lock, lease)
  return 1
end
if mode == 'end' then
  local cfg = prefix .. 'config'
  if #ARGV ~= 1 then return redis.error_reply('BAD_ARGUMENT n=' .. #ARGV) end
  local err = zset_err(prefix, 'moving')
  if err then return err end
  if redis.pcall('HGET', cfg, 'move_to') ~= ARGV[1] or redis.call('ZCARD', moving) > 0 then
    return 0
  end
  return write_refused(redis.pcall('HDEL', cfg, 'move_to', 'move_take_ms'), 'config', 'hash') or 1
end
local token = table.remove(ARGV, 1)
if type(token) ~= 'string' or #token > 64 then
  return redis.error_reply('BAD_ARGUMENT token=' .. string.sub(tostring(token), 1, 40))
end
if #ARGV < 1 or #ARGV > MAX_IDS then return redis.error_reply('BAD_ARGUMENT n=' .. #ARGV) end
for _, id in ipairs(ARGV) do
  if not job_id_ok(id) then return redis.error_reply('BAD_ARGUMENT id=' .. string.sub(id, 1, 40)) end
end
local err = zset_err(prefix, 'moving') or (mode == 'back' and zset_err(prefix, 'due'))
  or move_lock_err(prefix, token)
if err then return err end
local done = 0
for _, id in ipairs(ARGV) do
  local at = redis.call('ZSCORE', moving, id)
  if at then
    redis.call('ZREM', moving, id)
    if mode == 'back' then redis.call('ZADD', KEYS[2], at, id) else job_del(prefix, id) end
    done = done + 1
  end
end
return done
