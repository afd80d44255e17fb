-- xdp-limiter: the sources any node synced with deltas recently
-- (limiter-user/src/cluster/store.rs, Store::hot_sources), so a node also
-- syncs sources that are hot elsewhere and light here.
--
-- KEYS     "<prefix>:{g<group>}:hot" sorted sets (see sync.lua); one per
--          call in Redis Cluster mode, all groups at once on a single
--          instance
-- ARGV[1]  period, ms: members with a score (Redis time, ms) at most this
--          old are returned
-- ARGV[2]  most members returned in all: the rest are only counted, so
--          neither the reply nor the node taking it grows with the hot
--          set
--
-- Returns {members left out, member, member, ...}.
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local since = now_ms - tonumber(ARGV[1])
local room = tonumber(ARGV[2])
local out = {0}
local omitted = 0
for _, key in ipairs(KEYS) do
  if room > 0 then
    local members = redis.call('ZRANGEBYSCORE', key, since, '+inf', 'LIMIT', 0, room)
    for _, member in ipairs(members) do
      out[#out + 1] = member
    end
    room = room - #members
    if room == 0 then
      omitted = omitted + redis.call('ZCOUNT', key, since, '+inf') - #members
    end
  else
    omitted = omitted + redis.call('ZCOUNT', key, since, '+inf')
  end
end
out[1] = omitted
return out
