-- tollgate token bucket, version 4: the protocol is in the lua package's
-- documentation (lua/doc.go). In short: KEYS are n >= 1 buckets, decided
-- together, all or nothing, on Redis's clock; ARGV holds k, cap and q per
-- key (time in units of 1/q µs; k = cost*t, cap = burst*t); every k fits
-- when k <= 0 or D + k <= cap for each bucket (D = max(TAT - now, 0)), and
-- then each TAT becomes max(TAT, now) + k/q, else nothing is written. The
-- reply is {allowed, du1, df1, ...}, each debt dui + dfi/q µs. A state is
-- "<u>" or "<u>+<f>/<q>"; a fraction in another q is rounded up; every
-- write sets the TTL to the time until full; a full bucket is deleted.

local n = #KEYS
if n < 1 or #ARGV ~= 3 * n then
  return redis.error_reply('ERR tollgate: want 3 arguments per key')
end
local LIMIT = 1125899906842624 -- 2^50
if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: allow writes after TIME
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]

local ks, qs, dus, dfs = {}, {}, {}, {}
local all = true
for i = 1, n do
  local k, cap, q = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  if not (k and cap and q and cap >= 1 and cap <= LIMIT and q >= 1 and q <= LIMIT
      and k >= -cap and k <= cap and k % 1 == 0 and cap % 1 == 0 and q % 1 == 0) then
    return redis.error_reply('ERR tollgate: invalid arguments')
  end
  local du, df = 0, 0
  local v = redis.call('GET', KEYS[i])
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
  ks[i], qs[i], dus[i], dfs[i] = k, q, du, df
end

local reply = {all and 1 or 0}
for i = 1, n do
  local k, q, du, df = ks[i], qs[i], dus[i], dfs[i]
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
  reply[2 * i], reply[2 * i + 1] = du, df
end
return reply
