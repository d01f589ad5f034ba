--[[ complete: record success for leases the caller holds, many in one call.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (as in enqueue.lua)
  ARGV[1] result_ttl_ms   how long the outcome record (state, result, finished_ms) is kept
  then triples: id, token, result (JSON text)
  Returns: one status per job: 'done' | 'stale' | 'cancelled' | 'missing'.
    A stale token changes nothing. A re-sent call with the same token answers 'done' again.
  Errors:  BAD_ARGUMENT <field>=<value> ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/lease.lua"

local prefix, leased = KEYS[1], KEYS[3]
local ttl, err = int_arg(ARGV[1], 'result_ttl_ms', 1)
if err then return err end
if #ARGV % 3 ~= 1 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
local now = now_ms()
local out, done = {}, 0
for i = 2, #ARGV, 3 do
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local status, outcome = lease_check(prefix, id, token)
  if status == 'settled' then
    status = (outcome == 'done') and 'done' or 'stale'
  elseif status == 'held' then
    local jk = prefix .. 'job:' .. id
    redis.call('ZREM', leased, id)
    redis.call('HSET', jk, 'state', 'done', 'result', result, 'finished_ms', fmt(now))
    redis.call('HDEL', jk, 'worker')
    settle(jk, token, 'done')
    redis.call('PEXPIRE', jk, ttl)
    status = 'done'
    done = done + 1
  end
  out[#out + 1] = status
end
bump_stat(prefix, now, 'complete', done)
return out
