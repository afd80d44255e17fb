-- xdp-limiter node heartbeat (limiter-user/src/cluster/store.rs). Records
-- the node alive at Redis TIME, forgets nodes silent for longer than the
-- alive period and returns how many are alive (the divisor of the cold and
-- split caps).
--
-- With an instance token, the node's name is also guarded: two daemons
-- that share a name would each claim the whole room of a source, so a
-- heartbeat under a name whose guard key holds another daemon's token
-- (renewed within the alive period) writes nothing and returns that
-- token. A daemon that stopped stops renewing its guard, which expires
-- after the alive period: a restart of the same node waits at most that.
--
-- KEYS[1]  "<prefix>:nodes", a sorted set: member node name, score the
--          Redis time of its last heartbeat, ms
-- KEYS[2]  "<prefix>:{<prefix>:nodes}:node:<node>", the name's guard: a
--          string, the token of the daemon heartbeating under it, expiring
--          after the alive period (hash-tagged with KEYS[1]'s name, so
--          both are in one Redis Cluster slot)
-- ARGV[1]  node name
-- ARGV[2]  alive period, ms
-- ARGV[3]  this daemon's instance token; empty: the name is not guarded
--
-- Returns {nodes alive, holder, ms until the holder's guard expires}:
-- holder is empty when the heartbeat was recorded, else the other
-- daemon's token (and nothing was written).
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local alive_ms = tonumber(ARGV[2])
local token = ARGV[3]
if token ~= '' then
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= token then
    local live = redis.call('ZCOUNT', KEYS[1], now_ms - alive_ms, '+inf')
    return {live, holder, redis.call('PTTL', KEYS[2])}
  end
  redis.call('SET', KEYS[2], token, 'PX', alive_ms)
end
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now_ms - alive_ms))
-- The set itself goes when every node has stopped.
redis.call('PEXPIRE', KEYS[1], alive_ms * 2)
return {redis.call('ZCARD', KEYS[1]), '', 0}
