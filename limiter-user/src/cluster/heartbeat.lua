-- xdp-limiter node heartbeat (limiter-user/src/cluster/store.rs). Records
-- the node alive at Redis TIME, forgets nodes silent for longer than the
-- alive period and returns how many are alive (the divisor of the cold and
-- split caps).
--
-- KEYS[1]  "<prefix>:nodes", a sorted set: member node name, score the
--          Redis time of its last heartbeat, ms
-- ARGV[1]  node name
-- ARGV[2]  alive period, ms
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local alive_ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now_ms - alive_ms))
-- The set itself goes when every node has stopped.
redis.call('PEXPIRE', KEYS[1], alive_ms * 2)
return redis.call('ZCARD', KEYS[1])
