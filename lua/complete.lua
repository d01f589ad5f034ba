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
local out, took = {}, {}
local now_s = fmt(now)
for i = 2, #ARGV, 3 do
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local status, outcome = lease_check(prefix, id, token)
  if status == 'settled' then
    status = (outcome == 'done') and 'done' or 'stale'
  elseif status == 'held' then
    local jk = prefix .. 'job:' .. id
    -- settled_token/settled: a re-sent call with this token is answered 'done' again.
    redis.call('HSET', jk, 'state', 'done', 'result', result, 'finished_ms', now_s,
      'settled_token', token, 'settled', 'done')
    redis.call('PEXPIRE', jk, ttl)
    took[#took + 1] = id
    status = 'done'
  end
  out[#out + 1] = status
end
if #took > 0 then redis.call('ZREM', leased, unpack(took)) end
local done = #took
bump_stat(prefix, now, 'complete', done)
return out
