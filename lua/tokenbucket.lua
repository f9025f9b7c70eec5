-- tollgate token bucket and window quotas, version 7: the protocol is in
-- the lua package's documentation (lua/doc.go). In short: KEYS are buckets or
-- window quotas, and ARGV groups of them, each decided all or nothing, one
-- after another, on Redis's clock: a group is its number of keys m, then
-- each key's arguments. A bucket's are k, cap and q (time in units of 1/q
-- µs; k = cost*t, cap = burst*t); every k fits when k <= 0 or D + k <= cap (D =
-- max(TAT - now, 0)), and then each TAT becomes max(TAT, now) + k/q, else
-- nothing is written. Its reply is du, df: the debt du + df/q µs. A state is
-- "<u>" or "<u>+<f>/<q>"; a fraction in another q is rounded up; every write
-- sets the TTL to the time until full; a full bucket is deleted. A window
-- quota's arguments are k, its quota, and 0 (fixed) or -1 (sliding) and 4
-- window bounds, or -2 (fixed) or -3 (sliding) and the period of windows from
-- the epoch; its state "<start>:<prev>:<cur>", its reply now, prev, cur, start.
-- The reply is, per group, 1 if its ks were applied (else 0; -1 if a key
-- holds another type), then its keys'.

local LIMIT = 1125899906842624 -- 2^50
-- Globals read once, as locals, and one format per state written: a merged
-- call of 32 Takes on new keys spent 6 % less time per Take (9.49 µs against
-- 10.11, bench/cmd/luaexp, 10 alternating runs).
local call, pcall_, format, match, tonumber, type, KEYS =
  redis.call, redis.pcall, string.format, string.match, tonumber, type, KEYS

-- Every argument as a number, converted once, by arithmetic: calling a C
-- function such as tonumber costs Redis more than the conversion. A merged
-- call of 32 Takes on 32 keys spent 13-18 % less time per Take than with
-- tonumber at each use (bench/cmd/luaexp, 3 alternating runs). Each distinct
-- string is converted once, as a merged call repeats its Limits' arguments:
-- 1.6 % less again (9.33 µs, same runs).
local a, nargs, seen = {}, #ARGV, {}
if not pcall(function()
  for x = 1, nargs do
    local v = ARGV[x]
    local n = seen[v]
    if not n then
      n = v + 0
      seen[v] = n
    end
    a[x] = n
  end
end) then
  return redis.error_reply('ERR tollgate: invalid arguments')
end

-- Check every group's arguments before anything is read or written: an
-- error reply has written nothing.
local groups, i, j = 0, 1, 1
while j <= nargs do
  local m = a[j]
  if not (m and m >= 1 and m % 1 == 0 and i + m - 1 <= #KEYS) then
    return redis.error_reply('ERR tollgate: invalid arguments')
  end
  j = j + 1
  for _ = 1, m do
    local k, cap, q = a[j], a[j + 1], a[j + 2]
    if not (k and cap and q and cap >= 1 and cap <= LIMIT and q >= -3 and q <= LIMIT
        and k >= -cap and k <= cap and k % 1 == 0 and cap % 1 == 0 and q % 1 == 0) then
      return redis.error_reply('ERR tollgate: invalid arguments')
    end
    if q < -1 then -- a window of a period from the epoch
      local p = a[j + 3]
      if not (p and p >= 1 and p <= LIMIT and p % 1 == 0) then
        return redis.error_reply('ERR tollgate: invalid window period')
      end
      j = j + 1
    elseif q < 1 then
      local b0, b1, b2, b3 = a[j + 3], a[j + 4], a[j + 5], a[j + 6]
      if not (b0 and b1 and b2 and b3 and b0 % 1 == 0 and b1 % 1 == 0 and b2 % 1 == 0 and b3 % 1 == 0
          and b0 < b1 and b1 < b2 and b2 < b3) then
        return redis.error_reply('ERR tollgate: invalid window bounds')
      end
      j = j + 4
    end
    j = j + 3
  end
  i, groups = i + m, groups + 1
end
if i ~= #KEYS + 1 or groups == 0 then
  return redis.error_reply('ERR tollgate: invalid arguments')
end

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then -- Redis < 5: writes after TIME
  redis.replicate_commands()
end
local t = call('TIME')
local now = t[1] * 1000000 + t[2]

-- Each group: read its keys into their slots of the reply, r + 1...: a
-- bucket's du, df; a window's now, prev, cur, start (its bounds, and k, in
-- wins); then, if every k fits, write them. A group sees the writes of the
-- groups before it (one key in two groups is decided twice, in order). A
-- key that cannot be read (another type) fails its group, -1, unwritten; a
-- call of one group then replies Redis's error. A key's value is read once
-- and written once per call (vals: its value now, false if none, or the
-- error of another type; ttls: the
-- expiry in ms to set, false to delete it): a key in every group of a merged
-- call of 32 (a hot or global bucket) took 37-58 % less time per Take than
-- with a GET and a SET per group and tonumber at each use (bench/cmd/luaexp
-- -hot, 3 alternating runs).
local reply, wins, r, vals, ttls = {}, nil, 0, {}, {}
i, j = 1, 1
while j <= nargs do
  local m = a[j]
  local gi, gj, gr, all, failed = i, j + 1, r + 1, true, false
  j, r = gj, gr
  for i = gi, gi + m - 1 do
    local k, cap, q = a[j], a[j + 1], a[j + 2]
    local key = KEYS[i]
    local v = vals[key]
    if v == nil then
      v = pcall_('GET', key)
      vals[key] = v
    end
    if type(v) == 'table' then
      if groups == 1 then
        return v
      end
      v, failed = false, true
    end
    if q >= 1 then -- a token bucket
      local du, df = 0, 0
      if v then
        local u, f, sq = tonumber(v), 0, q
        if not u then
          local x, y, z = match(v, '^(%d+)%+(%d+)/(%d+)$')
          if x then
            u, f, sq = x + 0, y + 0, z + 0
          end
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
      reply[r + 1], reply[r + 2], j, r = du, df, j + 3, r + 2
    else -- a window quota: pick the window of now among its bounds, given or from the epoch
      local b, n, sliding = nil, 7, q == -1 or q == -3
      if q < -1 then
        local p = a[j + 3]
        local s = now - now % p
        b, n = {s - p, s, s + p, s + 2 * p}, 4
      else
        b = {a[j + 3], a[j + 4], a[j + 5], a[j + 6]}
      end
      local b0, b3 = b[1], b[4]
      local s, e, mid = b0, b[2], false
      for w = 2, 3 do
        if now >= b[w] then
          s, e, mid = b[w], b[w + 1], w == 2
        end
      end
      local tn = math.min(math.max(now, s), e - 1)
      local prev, cur, start, far = 0, 0, s, false
      if now >= b3 then -- bounds a window old: now's window is unknown, refused as a far state
        start, far, cur = b3, true, cap
      elseif v then
        local x, p, c = match(v, '^(%d+):(%d+):(%d+)$')
        if x then
          x, p, c = x + 0, p + 0, c + 0
        end
        for w = 2, 3 do -- a later window's state (a clock gone back): decided there, at its start
          if x and x > s and x == b[w] then
            s, e, tn, mid = b[w], b[w + 1], b[w], w == 2
          end
        end
        if x and x >= s then -- a later window's counts as this one's
          prev, cur, start, far = p, c, x, x > s
        elseif x and sliding and x == s - (e - s) then
          prev = c
        end
      end
      if k < 0 and (far or not mid) then -- a refund, only in the window of its take
        k = 0
      end
      local count = cur
      if sliding and prev > 0 then
        count = cur + math.floor(prev * (e - tn) / (e - s))
      end
      if k > 0 and (far or count + k > cap) then -- far: a window past the bounds, its expiry unknown
        all = false
      end
      if not sliding then
        prev = 0
      end
      wins = wins or {}
      wins[i] = {s, e, k, n, sliding}
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], j, r = tn, prev, cur, start, j + n, r + 4
    end
  end
  reply[gr] = all and 1 or 0
  if failed then
    reply[gr], all = -1, false
  end
  i = gi + m
  -- All fit: write, with every k read again from a (a window's from wins).
  local wj, wr = gj, gr
  for wi = gi, i - 1 do
    if not all then
      break
    end
    local k, q, key = a[wj], a[wj + 2], KEYS[wi]
    if q < 1 then
      local w = wins[wi]
      local prev, cur = reply[wr + 2], reply[wr + 3]
      local c = math.max(cur + w[3], 0)
      if c ~= cur and c == 0 and prev == 0 then -- nothing counted: no state
        vals[key], ttls[key] = false, false
      elseif c ~= cur then -- written only if changed, its TTL from the clock's reading
        local ttl = w[2] - now
        if w[5] then
          ttl = ttl + w[2] - w[1]
        end
        ttl = math.max(ttl, 1)
        vals[key], ttls[key] = format('%d:%d:%d', reply[wr + 4], prev, c), (ttl + 999 - (ttl + 999) % 1000) / 1000
      end
      reply[wr + 3], wj, wr = c, wj + w[4], wr + 4
    else
      local du, df = reply[wr + 1], reply[wr + 2]
      if k > 0 then
        local f = df + k
        df = f % q
        du = du + (f - df) / q
      elseif k < 0 then
        local f = df + k -- as much as (-k)/q microseconds back
        local rem = f % q
        du, df = du + (f - rem) / q, rem
        if du < 0 then
          du, df = 0, 0
        end
      end
      if k ~= 0 and du == 0 and df == 0 then
        vals[key], ttls[key] = false, false
      elseif k ~= 0 then -- digits, not Lua numbers: Redis 7.2.0-7.2.4 sends 1e8 as "1e+08"
        local state, us = nil, du
        if df > 0 then
          state, us = format('%d+%d/%d', now + du, df, q), du + 1
        else
          state = format('%d', now + du)
        end
        vals[key], ttls[key] = state, (us + 999 - (us + 999) % 1000) / 1000
      end
      reply[wr + 1], reply[wr + 2], wj, wr = du, df, wj + 3, wr + 2
    end
  end
end
for key, ms in pairs(ttls) do -- each key written once, with its last state
  if ms then
    call('SET', key, vals[key], 'PX', format('%d', ms))
  else
    call('DEL', key)
  end
end
return reply
