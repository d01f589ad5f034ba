--[[ dead_match: which dead ids match the dead-letter task / error-type filter, read in one call
  per page instead of one HMGET reply per id (scheduler/operations/dead_filter.py). Read only.
  `jobs cancel --state --task` sends it waiting ids with the task filter alone: nothing here
  reads a dead-letter place (scheduler/cli/job_select.py).
  A job's task is its hash's, else its spec record's (the layout of lib/job.lua read_spec, read
  from the record's first 1,024 bytes; none when there is no record, or one of another type or
  no version wrote). Only a clean byte comparison is
  decided here; anything else is left to the caller, which reads those ids as it always did,
  so the result is the same.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>
  ARGV[1] '' = no task filter, else '=' .. task
  ARGV[2] '' = no error-type filter, else '=' .. error_type
  ARGV[3..] ids, at most MATCH_MAX
  Returns: a string, one character per id: '1' matches, '0' does not, '?' the caller decides
    (a compared field or the spec record's task is not valid UTF-8, or its job key is of
    another type).
  Errors:  BAD_ARGUMENT ids= (more than MATCH_MAX) ]]
-- @include "lib/utf8.lua"
-- @include "lib/job.lua"

local prefix, want_task, want_error = KEYS[1], ARGV[1], ARGV[2]
local MATCH_MAX = 1000
if #ARGV - 2 > MATCH_MAX then return redis.error_reply('BAD_ARGUMENT ids=') end

-- '1' / '0' for a stored value against a filter, '?' when the bytes do not say (not UTF-8).
local function test(value, want)
  if want == '' then return '1' end
  if not value then return '0' end
  if not is_utf8(value) then return '?' end
  return ('=' .. value == want) and '1' or '0'
end

-- The task of a job whose hash has none: its spec record's, read from the record's head only
-- (GETRANGE: a page of 1,000 records of 500 KB payloads, read and checked whole, held Redis for
-- 7 s); false: none (no record, one of another type, or no spec layout); nil: the caller
-- decides (a task that is not UTF-8, or a layout that may go on past the head).
local SPEC_HEAD = 1024  -- the fields before the payload: a task of 200 bytes, numbers, flags
local SPEC_FIELDS = '^2|([^|]*)|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|'
local function spec_task(id)
  local head = redis.pcall('GETRANGE', spec_key(prefix, id), 0, SPEC_HEAD - 1)
  if type(head) ~= 'string' or head == '' then return false end
  local task = string.match(head, SPEC_FIELDS)
  if task == nil then
    if #head < SPEC_HEAD then return false end  -- read whole: not a spec record
    return nil
  end
  if not is_utf8(task) then return nil end
  return task
end

local out = {}
for i = 3, #ARGV do
  local f = redis.pcall('HMGET', job_key(prefix, ARGV[i]), 'task', 'last_error_type')
  local c
  if f.err then
    c = '?'
  else
    c = test(f[2], want_error)
    if c ~= '0' and want_task ~= '' then
      local t
      if f[1] then
        t = test(f[1], want_task)
      else
        local task = spec_task(ARGV[i])
        if task == nil then t = '?' else t = test(task or nil, want_task) end
      end
      c = (t == '0' and '0') or ((c == '?' or t == '?') and '?') or '1'
    end
  end
  out[#out + 1] = c
end
return table.concat(out)
