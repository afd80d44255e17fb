-- xdp-limiter cluster sync (limiter-user/src/cluster/store.rs runs it with
-- EVALSHA). Adds this node's deltas for a batch of sources to the current
-- bucket and returns, per source, the cluster's and this node's totals over
-- the window. Atomic: every node reads totals that include its own deltas.
--
-- KEYS[i]  "<prefix>:{g<group>}:<source key>", one per report. All keys of
--          a call hash to one Redis Cluster slot (the client groups them by
--          group); the bucket keys are built here from KEYS[i] and keep its
--          hash tag, so they live in that same slot.
-- ARGV[1]  node name (the field prefix of this node's own counts)
-- ARGV[2]  bucket length, ms
-- ARGV[3]  buckets per window
-- ARGV[4]  TTL of a bucket key, ms (a window plus two buckets)
-- ARGV[3 + 2i], ARGV[4 + 2i]  admitted and offered deltas of report i
--
-- Bucket key "<KEYS[i]>:<bucket>", a hash:
--   a, o                    cluster admitted and offered in that bucket
--   <node>:a, <node>:o      that node's part
-- Hot set "<prefix>:{g<group>}:hot", a sorted set per group: member the
-- source key, score the Redis time (ms) of the last sync that carried
-- deltas for it from any node; members older than a window are dropped.
-- Other nodes read it to sync sources hot elsewhere (Store::hot_sources).
--
-- Returns {bucket, ca1, co1, oa1, oo1, ca2, ...}.

-- Redis TIME is the one clock: node clocks never move bucket edges.
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local node = ARGV[1]
local bucket_ms = tonumber(ARGV[2])
local buckets = tonumber(ARGV[3])
local ttl_ms = tonumber(ARGV[4])
local bucket = math.floor(now_ms / bucket_ms)
local own_a = node .. ':a'
local own_o = node .. ':o'
local window_ms = bucket_ms * buckets
local pruned = {}

local out = {bucket}
for i, base in ipairs(KEYS) do
  local admitted = tonumber(ARGV[3 + 2 * i])
  local offered = tonumber(ARGV[4 + 2 * i])
  if admitted > 0 or offered > 0 then
    local key = base .. ':' .. bucket
    redis.call('HINCRBY', key, 'a', admitted)
    redis.call('HINCRBY', key, 'o', offered)
    redis.call('HINCRBY', key, own_a, admitted)
    redis.call('HINCRBY', key, own_o, offered)
    -- Every write renews the TTL: a bucket outlives its window by two
    -- buckets, then goes (nothing is ever deleted explicitly).
    redis.call('PEXPIRE', key, ttl_ms)
    -- The tag ends at the first '}' (the prefix has none); the hot set
    -- shares it, so it is in this call's slot.
    local tag_end = string.find(base, '}', 1, true)
    local hot = string.sub(base, 1, tag_end) .. ':hot'
    redis.call('ZADD', hot, now_ms, string.sub(base, tag_end + 2))
    if not pruned[hot] then
      pruned[hot] = true
      redis.call('ZREMRANGEBYSCORE', hot, '-inf', '(' .. (now_ms - window_ms))
      redis.call('PEXPIRE', hot, ttl_ms)
    end
  end
  local ca, co, oa, oo = 0, 0, 0, 0
  for b = bucket - buckets + 1, bucket do
    local v = redis.call('HMGET', base .. ':' .. b, 'a', 'o', own_a, own_o)
    ca = ca + (tonumber(v[1]) or 0)
    co = co + (tonumber(v[2]) or 0)
    oa = oa + (tonumber(v[3]) or 0)
    oo = oo + (tonumber(v[4]) or 0)
  end
  out[#out + 1] = ca
  out[#out + 1] = co
  out[#out + 1] = oa
  out[#out + 1] = oo
end
return out
