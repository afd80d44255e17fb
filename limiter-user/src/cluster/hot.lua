-- xdp-limiter: the sources any node synced with deltas recently
-- (limiter-user/src/cluster/store.rs, Store::hot_sources), so a node also
-- syncs sources that are hot elsewhere and light here.
--
-- KEYS     "<prefix>:{g<group>}:hot" sorted sets (see sync.lua); one per
--          call in Redis Cluster mode, all groups at once on a single
--          instance
-- ARGV[1]  period, ms: members with a score (Redis time, ms) at most this
--          old are returned
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local since = now_ms - tonumber(ARGV[1])
local out = {}
for _, key in ipairs(KEYS) do
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, since, '+inf')) do
    out[#out + 1] = member
  end
end
return out
