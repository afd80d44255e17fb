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
-- ARGV[5]  claim horizon, ms: this node's next sync is about this far
--          ahead, so the claim is made on the window as it will be then
-- ARGV[6]  claim hold, ms: how long this node's claim holds others back
--          if it does not sync again (its kernel keeps a share this long)
-- ARGV[7]  nodes alive (splits the room while nothing was offered yet)
-- ARGV[5 + 3i], ARGV[6 + 3i], ARGV[7 + 3i]  admitted and offered deltas
--          and the cluster-wide limit of report i
--
-- Bucket key "<KEYS[i]>:<bucket>", a hash:
--   a, o                    cluster admitted and offered in that bucket
--   <node>:a, <node>:o      that node's part
-- Hot set "<prefix>:{g<group>}:hot", a sorted set per group: member the
-- source key, score the Redis time (ms) of the last sync that carried
-- deltas for it from any node; members older than a window are dropped.
-- Other nodes read it to sync sources hot elsewhere (Store::hot_sources).
--
-- Claim key "<KEYS[i]>:r", a hash: field a node's name, value
--   "<claim>:<expires ms>:<offered>", what that node may still admit until
--   its next sync and what it was offered over the window then (see the
--   claim below).
--
-- Returns {bucket, ca1, co1, oa1, oo1, claim1, ca2, ...}.
--
-- The claim (limiter-user/src/cluster/share.rs, `node_claim`, is the same
-- arithmetic in Rust, and cluster_store.rs checks they agree):
--   room  = max(L - admitted over the buckets still in the window at
--           now + horizon, 0)
--   fair  = max(floor(L x own offered / (own offered + the offered of
--           the other nodes with a live claim)) - this node's admitted
--           over the buckets still in the window at now + horizon, 0)
--           (floor(room / nodes alive) while nothing was offered)
--   claim = max(0, min(fair, room - the other nodes' live claims))
-- The fair part is a share of the window, less what the node holds in
-- it, not a share of the room: the room includes the others' unreported
-- claims, so shares of it would add up past the room and the node
-- ticking first after room frees would take the difference.
-- The fair part counts only nodes still claiming: a node that left (or
-- whose traffic moved away and stopped syncing the source) stops
-- diluting the others' parts as soon as its claim expires, not a window
-- later when its offered counts leave.
-- Claims reserve room: another node's claim is room it may admit before
-- it reports, so no two nodes hand out the same room however their ticks
-- interleave; the claims over nodes never exceed the room. The horizon
-- hands out room that leaves the window before the next sync, which
-- would otherwise sit unused for a sync interval.

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
local horizon_ms = tonumber(ARGV[5])
local hold_ms = tonumber(ARGV[6])
local alive = math.max(tonumber(ARGV[7]), 1)
local window_ms = bucket_ms * buckets
-- The first bucket still in the window at the next sync.
local next_first = math.floor((now_ms + horizon_ms) / bucket_ms) - buckets + 1
local pruned = {}

local out = {bucket}
for i, base in ipairs(KEYS) do
  local admitted = tonumber(ARGV[5 + 3 * i])
  local offered = tonumber(ARGV[6 + 3 * i])
  local limit = tonumber(ARGV[7 + 3 * i])
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
  local ca, co, oa, oo, ahead, own_ahead = 0, 0, 0, 0, 0, 0
  for b = bucket - buckets + 1, bucket do
    local v = redis.call('HMGET', base .. ':' .. b, 'a', 'o', own_a, own_o)
    local a = tonumber(v[1]) or 0
    local own = tonumber(v[3]) or 0
    ca = ca + a
    co = co + (tonumber(v[2]) or 0)
    oa = oa + own
    oo = oo + (tonumber(v[4]) or 0)
    if b >= next_first then
      ahead = ahead + a
      own_ahead = own_ahead + own
    end
  end
  -- The claim: this node's fair part of the window less what it holds
  -- there, within the room the other nodes have not claimed. Claims past their expiry are ignored
  -- (a node that stopped syncing) and dropped.
  local claims = base .. ':r'
  local others, claimers_offered = 0, oo
  local kv = redis.call('HGETALL', claims)
  for k = 1, #kv, 2 do
    local c, e, o = string.match(kv[k + 1], '^(%d+):(%d+):(%d+)$')
    if kv[k] ~= node and c and tonumber(e) > now_ms then
      others = others + tonumber(c)
      claimers_offered = claimers_offered + tonumber(o)
    elseif kv[k] ~= node then
      redis.call('HDEL', claims, kv[k])
    end
  end
  local room = math.max(limit - ahead, 0)
  local fair
  if claimers_offered > 0 then
    fair = math.max(math.floor(limit * oo / claimers_offered) - own_ahead, 0)
  else
    fair = math.floor(room / alive)
  end
  local claim = math.max(0, math.min(fair, room - others))
  redis.call('HSET', claims, node,
    string.format('%d:%d:%d', claim, now_ms + hold_ms, oo))
  redis.call('PEXPIRE', claims, math.max(hold_ms, ttl_ms))
  out[#out + 1] = ca
  out[#out + 1] = co
  out[#out + 1] = oa
  out[#out + 1] = oo
  out[#out + 1] = claim
end
return out
