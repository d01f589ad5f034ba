--[[ purge_dead: delete parked jobs for good.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (as in enqueue.lua)
  ARGV ids (picked by the client from the dead list)
  Returns: the number of jobs deleted. An id that is not dead is skipped. ]]

local prefix, dead = KEYS[1], KEYS[4]
local purged = 0
for _, id in ipairs(ARGV) do
  local jk = prefix .. 'job:' .. id
  if redis.call('HGET', jk, 'state') == 'dead' and redis.call('LREM', dead, 0, id) > 0 then
    redis.call('DEL', jk)
    purged = purged + 1
  end
end
return purged
