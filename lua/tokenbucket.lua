-- tollgate token bucket and window quotas, version 5: the protocol is in
-- the lua package's documentation (lua/doc.go). In short: KEYS are n >= 1
-- buckets or window quotas, decided together, all or nothing, on Redis's
-- clock. A bucket's ARGV are k, cap and q (time in units of 1/q µs; k =
-- cost*t, cap = burst*t); every k fits when k <= 0 or D + k <= cap (D =
-- max(TAT - now, 0)), and then each TAT becomes max(TAT, now) + k/q, else
-- nothing is written. Its reply is du, df: the debt du + df/q µs. A state is
-- "<u>" or "<u>+<f>/<q>"; a fraction in another q is rounded up; every write
-- sets the TTL to the time until full; a full bucket is deleted. A window
-- quota's ARGV are k, its quota, 0 (fixed) or -1 (sliding) and 4 window
-- bounds; its state "<start>:<prev>:<cur>", its reply now, prev, cur, start.

local n = #KEYS
local LIMIT = 1125899906842624 -- 2^50
if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: allow writes after TIME
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]

-- Read every key; all stays true while each k fits. A window's view is in
-- dus (its now), dfs (prev) and wins (start, end, cur, state's start).
local ks, qs, dus, dfs, wins, j, all = {}, {}, {}, {}, {}, 1, true
for i = 1, n do
  local k, cap, q = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  if not (k and cap and q and cap >= 1 and cap <= LIMIT and q >= -1 and q <= LIMIT
      and k >= -cap and k <= cap and k % 1 == 0 and cap % 1 == 0 and q % 1 == 0) then
    return redis.error_reply('ERR tollgate: invalid arguments')
  end
  local v = redis.call('GET', KEYS[i])
  if q >= 1 then -- a token bucket
    j = j + 3
    local du, df = 0, 0
    if v then
      local u, f, sq = tonumber(v), 0, q
      if not u then
        local a, b, c = string.match(v, '^(%d+)%+(%d+)/(%d+)$')
        u, f, sq = tonumber(a), tonumber(b), tonumber(c)
      end
      if u and u % 1 == 0 and u >= 0 and u < 9007199254740992 and f < sq then
        if sq ~= q and f > 0 then
          u, f = u + 1, 0
        end
        if u > now or (u == now and f > 0) then
          du, df = u - now, f
        end
      end
    end
    if k > 0 and (du > (cap - cap % q) / q + 1 or du * q + df + k > cap) then
      all = false
    end
    dus[i], dfs[i] = du, df
  else -- a window quota: pick the window of now among the bounds
    local b = {tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6])}
    j = j + 7
    if not (b[1] and b[2] and b[3] and b[4] and b[1] % 1 == 0 and b[2] % 1 == 0 and b[3] % 1 == 0 and b[4] % 1 == 0
        and b[1] < b[2] and b[2] < b[3] and b[3] < b[4]) then
      return redis.error_reply('ERR tollgate: invalid window bounds')
    end
    local s, e, mid = b[1], b[2], false
    for w = 2, 3 do
      if now >= b[w] then
        s, e, mid = b[w], b[w + 1], w == 2
      end
    end
    local tn = math.min(math.max(now, s), e - 1)
    local prev, cur, start, far = 0, 0, s, false
    if v then
      local a, p, c = string.match(v, '^(%d+):(%d+):(%d+)$')
      a, p, c = tonumber(a), tonumber(p), tonumber(c)
      for w = 2, 3 do -- a later window's state (a clock gone back): decided there, at its start
        if a and a > s and a == b[w] then
          s, e, tn, mid = b[w], b[w + 1], b[w], w == 2
        end
      end
      if a and a >= s then -- a later window's counts as this one's
        prev, cur, start, far = p, c, a, a > s
      elseif a and q == -1 and a == s - (e - s) then
        prev = c
      end
    end
    if k < 0 and (far or not mid) then -- a refund, only in the window of its take
      k = 0
    end
    local count = cur
    if q == -1 and prev > 0 then
      count = cur + math.floor(prev * (e - tn) / (e - s))
    end
    if k > 0 and (far or count + k > cap) then -- far: a window past the bounds, its expiry unknown
      all = false
    end
    dus[i], dfs[i], wins[i] = tn, prev, {s, e, cur, start}
  end
  ks[i], qs[i] = k, q
end
if j ~= #ARGV + 1 then
  return redis.error_reply('ERR tollgate: invalid arguments')
end

-- Write, if all fit, and reply.
local reply = {all and 1 or 0}
for i = 1, n do
  local k, q, du, df = ks[i], qs[i], dus[i], dfs[i]
  if q < 1 then
    local w = wins[i]
    local tn, prev, cur = du, df, w[3]
    if all then
      cur = math.max(cur + k, 0)
    end
    if q ~= -1 then
      prev = 0
    end
    if cur ~= w[3] and cur == 0 and prev == 0 then -- nothing counted: no state
      redis.call('DEL', KEYS[i])
    elseif cur ~= w[3] then -- written only if changed, its TTL from the clock's reading
      local ttl = w[2] - now
      if q == -1 then
        ttl = ttl + w[2] - w[1]
      end
      ttl = math.max(ttl, 1)
      redis.call('SET', KEYS[i], string.format('%d:%d:%d', w[4], prev, cur),
        'PX', string.format('%d', (ttl + 999 - (ttl + 999) % 1000) / 1000))
    end
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = tn, prev, cur, w[4]
  else
    if all and k ~= 0 then
      if k > 0 then
        local f = df + k
        df = f % q
        du = du + (f - df) / q
      else
        local f = df + k -- as much as (-k)/q microseconds back
        local r = f % q
        du, df = du + (f - r) / q, r
        if du < 0 then
          du, df = 0, 0
        end
      end
      if du == 0 and df == 0 then
        redis.call('DEL', KEYS[i])
      else
        local state = string.format('%d', now + du)
        if df > 0 then
          state = state .. '+' .. string.format('%d', df) .. '/' .. string.format('%d', q)
        end
        local us = du
        if df > 0 then
          us = us + 1
        end
        redis.call('SET', KEYS[i], state, 'PX', string.format('%d', (us + 999 - (us + 999) % 1000) / 1000))
      end
    end
    reply[#reply + 1], reply[#reply + 2] = du, df
  end
end
return reply
