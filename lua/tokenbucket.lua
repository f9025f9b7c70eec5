-- tollgate token bucket, version 2.
--
-- A token bucket of capacity B refilled continuously at R tokens per P
-- microseconds, kept as GCRA state: the bucket's "theoretical arrival time"
-- (TAT), the instant at which the bucket will be full again. A missing key is
-- a full bucket. All arithmetic is on integers; the clock is Redis's own
-- (TIME), never an app server's.
--
-- One call decides n >= 1 buckets together, all or nothing. For bucket i
-- (1-based):
-- KEYS[i]      the bucket key. One key per bucket; the keys are distinct, and
--              on Redis Cluster they share a {hash tag}.
-- ARGV[4i-3]   R, rate: tokens added per period, integer >= 1
-- ARGV[4i-2]   P, period in microseconds, integer >= 1
-- ARGV[4i-1]   B, burst: capacity in tokens, integer >= 1
-- ARGV[4i]     c, cost: tokens to take, integer, -B <= c <= B; a negative c
--              gives -c tokens back (a refund), never above capacity
--              Limits: B*R <= 2^50 and B*(floor(P/R)+1) <= 2^50 (microseconds).
--
-- The c tokens of every bucket are taken if every bucket has them (a refund
-- always fits); otherwise none is taken, none given back, nothing written.
--
-- Reply: an array of 4n integers, four per bucket in KEYS order:
--   [4i-3] allowed         1 if the tokens were taken (always 1 when no
--                          c > 0), else 0 — the same for every bucket
--   [4i-2] remaining       whole tokens left in bucket i after this decision
--   [4i-1] retry_after_us  microseconds until bucket i holds its c tokens
--                          (rounded up); 0 when it holds them now
--   [4i]   reset_after_us  microseconds until bucket i is full again (rounded up)
-- or an error reply starting with "ERR tollgate:" for arguments out of range.
-- With n = 1 this is version 1's protocol unchanged.
--
-- State, the string value of KEYS[i]:
--   "<tat>"              TAT in whole microseconds of Redis's clock, or
--   "<tat>+<f>/<R>"      TAT plus f/R of a microsecond (0 < f < R), used when
--                        P is not a multiple of R.
-- A value that does not parse is treated as a full bucket and replaced; a
-- value further from full than B*T (left by a larger limit on the same key)
-- is read as an empty bucket.
--
-- Invariants:
--   * c tokens are taken only when all c are there, in every bucket; a
--     denial writes nothing; c = 0 reads the bucket and writes nothing; a
--     refund that fills the bucket deletes its key.
--   * Every write sets the key's expiry (PX) to the time until the bucket is
--     full again, so no key lives without a TTL and a full bucket is no key.
--   * Durations are pairs (u, f) meaning u + f/R microseconds, 0 <= f < R,
--     so rates that do not divide the period stay exact.

local LIMIT = 1125899906842624 -- 2^50
local n = #KEYS
if n < 1 or #ARGV ~= 4 * n then
  return redis.error_reply('ERR tollgate: want 4 arguments per key')
end

-- One bucket, the common case, is decided first and inline, before the
-- general code's functions exist: Redis creates those anew on every call,
-- and creating and calling them cost a fifth of the call. The steps are
-- those of check, read, write and remaining below, on the same numbers in
-- the same order, so both give the same replies and writes; keep them in
-- step. Bad arguments go on to the general code before anything is read:
-- check has the last word on errors.
if n == 1 then
  local R, P, B, c = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  if R and P and B and c and R >= 1 and P >= 1 and B >= 1 and c >= -B and c <= B
      and R % 1 == 0 and P % 1 == 0 and B % 1 == 0 and c % 1 == 0 then
    local Tq = math.floor(P / R) -- T = P/R = Tq + Tr/R, as divmod gives it
    local Tr = P - Tq * R
    if Tr < 0 then
      Tq, Tr = Tq - 1, Tr + R
    elseif Tr >= R then
      Tq, Tr = Tq + 1, Tr - R
    end
    if B * R <= LIMIT and B * (Tq + 1) <= LIMIT then
      if redis.replicate_commands then
        redis.replicate_commands() -- Redis < 5: allow writes after TIME
      end
      local t = redis.call('TIME')
      local now = t[1] * 1000000 + t[2] -- as in clock
      local v = redis.call('GET', KEYS[1])
      local tat = v and tonumber(v)

      -- On plain integers when R divides P and the state is a whole number,
      -- or there is no key: every f below would be 0.
      if Tr == 0 and (not v or tat and tat % 1 == 0) then
        local T = Tq
        local d, cap = 0, B * T -- the debt D, not above the capacity B*T
        if tat and now <= tat then
          d = tat - now
          if d > cap then
            d = cap
          end
        end
        local nd, retry = 0, 0 -- the debt after taking c; microseconds until c tokens are there
        if c >= 0 then
          nd = d + c * T
          if c > 0 and nd > cap then
            retry = nd - cap
          end
        elseif -c * T <= d then
          nd = d + c * T
        end
        local allowed = 0
        if retry == 0 then
          allowed = 1
          if c ~= 0 and nd == 0 then
            redis.call('DEL', KEYS[1])
          elseif c ~= 0 then
            local ttl = math.ceil(nd / 1000)
            if ttl >= 100000000 then
              ttl = string.format('%.0f', ttl) -- as in write
            end
            -- '%.0f', not the cheaper '%d': Lua's '%d' goes through a C long,
            -- which is 32 bits on 32-bit builds of Redis
            redis.call('SET', KEYS[1], string.format('%.0f', now + nd), 'PX', ttl)
          end
          d = nd
        end
        -- remaining is floor((B*T - D) / T), exact for integers up to 2^50
        return {allowed, math.floor((cap - d) / T), retry, d}
      end

      -- Otherwise on pairs (u, f) = u + f/R, with le, add, sub and ceil
      -- written out. Every k*T below (times) has k <= B, so k*Tr < B*R <=
      -- 2^50 and floor(k*Tr / R) is exact: divmod would correct nothing.
      local du, df = 0, 0 -- the debt D, as in read
      if v then
        local tf = 0
        if not tat then
          local su, sf, sd = string.match(v, '^(%d+)%+(%d+)/(%d+)$')
          if su then -- digits: arithmetic converts them once, tonumber twice
            tat, tf = su + 0, sf + 0
            if sd ~= ARGV[1] and sd + 0 ~= R then
              tat, tf = tat + 1, 0 -- stored under another rate: round up, never loosen
            end
          end
        end
        if tat and tf < R and now <= tat then -- le(now, 0, tat, tf), as tf >= 0
          du, df = tat - now, tf
        end
      end
      local x = B * Tr
      local q = math.floor(x / R)
      local cu, cf = B * Tq + q, x - q * R -- the capacity B*T
      if not (du < cu or du == cu and df <= cf) then
        du, df = cu, cf -- state left by a larger limit: read as an empty bucket
      end
      local k = c -- c*T, or -c*T for a refund
      if c < 0 then
        k = -c
      end
      x = k * Tr
      q = math.floor(x / R)
      local ku, kf = k * Tq + q, x - q * R
      local nu, nf, retry = 0, 0, 0 -- the debt after taking c; microseconds until c tokens are there
      if c >= 0 then
        nu, nf = du + ku, df + kf
        if nf >= R then
          nu, nf = nu + 1, nf - R
        end
        if c > 0 and not (nu < cu or nu == cu and nf <= cf) then
          local ru, rf = nu - cu, nf - cf
          if rf < 0 then
            ru, rf = ru - 1, rf + R
          end
          retry = ru
          if rf > 0 then
            retry = ru + 1
          end
        end
      elseif ku < du or ku == du and kf <= df then -- a refund: D - (-c)*T, else 0 (full)
        nu, nf = du - ku, df - kf
        if nf < 0 then
          nu, nf = nu - 1, nf + R
        end
      end
      local allowed = 0
      if retry == 0 then -- as in write
        allowed = 1
        if c ~= 0 and nu == 0 and nf == 0 then
          redis.call('DEL', KEYS[1])
          du, df = 0, 0
        elseif c ~= 0 then
          -- The new TAT now + D (nf < R: nothing carries), in '%.0f' as in
          -- write ('%d' goes through a C long: 32 bits on 32-bit builds).
          local tu, ttl = now + nu, nu -- ttl: ceil(D), then in milliseconds
          local state
          if nf > 0 then
            state, ttl = string.format('%.0f+%.0f/%.0f', tu, nf, R), nu + 1
          else
            state = string.format('%.0f', tu)
          end
          ttl = math.ceil(ttl / 1000)
          if ttl < 1 then
            ttl = 1
          elseif ttl >= 100000000 then
            ttl = string.format('%.0f', ttl)
          end
          redis.call('SET', KEYS[1], state, 'PX', ttl)
          du, df = nu, nf
        end
      end
      -- remaining: the largest k <= B with k*T <= A = B*T - D, estimated in
      -- floating point and then corrected, stepping k*T by T
      local au, af = cu - du, cf - df
      if af < 0 then
        au, af = au - 1, af + R
      end
      k = math.floor((au + af / R) * R / P)
      if k < 0 then
        k = 0
      elseif k > B then
        k = B
      end
      x = k * Tr
      q = math.floor(x / R)
      local xu, xf = k * Tq + q, x - q * R -- k*T
      while k > 0 and not (xu < au or xu == au and xf <= af) do
        k, xu, xf = k - 1, xu - Tq, xf - Tr
        if xf < 0 then
          xu, xf = xu - 1, xf + R
        end
      end
      while k < B do
        xu, xf = xu + Tq, xf + Tr
        if xf >= R then
          xu, xf = xu + 1, xf - R
        end
        if not (xu < au or xu == au and xf <= af) then
          break
        end
        k = k + 1
      end
      if df > 0 then
        du = du + 1 -- ceil(D)
      end
      return {allowed, k, retry, du}
    end
  end
end

-- a = q*b + r with 0 <= r < b, exact for integers below 2^53.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

-- Arithmetic on pairs (u, f) = u + f/R microseconds, for one bucket's R.
local function le(a, af, b, bf)
  return a < b or (a == b and af <= bf)
end
local function add(R, a, af, b, bf)
  local u, f = a + b, af + bf
  if f >= R then
    u, f = u + 1, f - R
  end
  return u, f
end
local function sub(R, a, af, b, bf)
  local u, f = a - b, af - bf
  if f < 0 then
    u, f = u - 1, f + R
  end
  return u, f
end
local function ceil(u, f)
  if f > 0 then
    return u + 1
  end
  return u
end

-- check takes a bucket's arguments as tonumber gives them and returns R, P,
-- B, c and T = P/R as Tq + Tr/R, or nil and an error message.
local function check(R, P, B, c)
  if not (R and P and B and c) or R < 1 or P < 1 or B < 1 or c < -B or c > B
      or R % 1 ~= 0 or P % 1 ~= 0 or B % 1 ~= 0 or c % 1 ~= 0 then
    return nil, 'ERR tollgate: invalid arguments'
  end
  local Tq, Tr = divmod(P, R)
  if B * R > LIMIT or B * (Tq + 1) > LIMIT then
    return nil, 'ERR tollgate: limit out of range'
  end
  return R, P, B, c, Tq, Tr
end

-- k*T as a pair.
local function times(k, R, Tq, Tr)
  local q, r = divmod(k * Tr, R)
  return k * Tq + q, r
end

-- read returns a bucket's debt D = max(TAT - now, 0) (how far it is from
-- full), its capacity as time B*T, its debt after taking c, and the
-- microseconds until it holds c tokens (0: it does now). v is the bucket's
-- value, false for no key.
local function read(v, R, B, c, Tq, Tr, now)
  local du, df = 0, 0
  if v then
    local tu, tf = tonumber(v), 0
    if not tu then
      local su, sf, sd = string.match(v, '^(%d+)%+(%d+)/(%d+)$')
      tu, tf = tonumber(su), tonumber(sf)
      if tu and tonumber(sd) ~= R then
        tu, tf = tu + 1, 0 -- stored under another rate: round up, never loosen
      end
    end
    if tu and tf and tf < R and le(now, 0, tu, tf) then
      du, df = sub(R, tu, tf, now, 0)
    end
  end
  local cu, cf = times(B, R, Tq, Tr)
  if not le(du, df, cu, cf) then
    du, df = cu, cf -- state left by a larger limit: read as an empty bucket
  end
  local nu, nf, retry = 0, 0, 0
  if c >= 0 then
    local ku, kf = times(c, R, Tq, Tr)
    nu, nf = add(R, du, df, ku, kf)
    if c > 0 and not le(nu, nf, cu, cf) then
      retry = ceil(sub(R, nu, nf, cu, cf))
    end
  else -- a refund: D - (-c)*T, not below 0 (full)
    local ku, kf = times(-c, R, Tq, Tr)
    if le(ku, kf, du, df) then
      nu, nf = sub(R, du, df, ku, kf)
    end
  end
  return du, df, cu, cf, nu, nf, retry
end

-- write stores a bucket's new debt (nu, nf) after taking c (or giving -c
-- back) and returns it; c = 0 writes nothing.
local function write(key, R, c, now, du, df, nu, nf)
  if c == 0 then
    return du, df
  end
  if nu == 0 and nf == 0 then
    redis.call('DEL', key) -- full again: a full bucket is no key
    return 0, 0
  end
  local tu, tf = add(R, now, 0, nu, nf)
  local state = string.format('%.0f', tu)
  if tf > 0 then
    state = state .. '+' .. string.format('%.0f', tf) .. '/' .. string.format('%.0f', R)
  end
  local ttl = math.ceil(ceil(nu, nf) / 1000)
  if ttl < 1 then
    ttl = 1
  elseif ttl >= 100000000 then
    -- Redis 7.2.0 to 7.2.4 send a Lua number of 10^8 or more with many
    -- trailing zeros (1e8, 2e8, 1.5e9) as "1e+08"-like text, which SET
    -- refuses; below 10^8 a number always goes in full digits.
    ttl = string.format('%.0f', ttl)
  end
  redis.call('SET', key, state, 'PX', ttl)
  return nu, nf
end

-- remaining is the largest k <= B with D + k*T <= B*T.
local function remaining(R, P, B, Tq, Tr, cu, cf, du, df)
  local au, af = sub(R, cu, cf, du, df)
  local k = math.floor((au + af / R) * R / P)
  if k < 0 then k = 0 end
  if k > B then k = B end
  local xu, xf = times(k, R, Tq, Tr)
  while k > 0 and not le(xu, xf, au, af) do
    k = k - 1
    xu, xf = times(k, R, Tq, Tr)
  end
  while k < B do
    xu, xf = times(k + 1, R, Tq, Tr)
    if not le(xu, xf, au, af) then
      break
    end
    k = k + 1
  end
  return k
end

local function clock()
  if redis.replicate_commands then
    redis.replicate_commands() -- Redis < 5: allow writes after TIME
  end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2] -- arithmetic converts once; tonumber would twice
end

-- Several buckets (or one with bad arguments): check every one's arguments
-- before reading anything, read them all, then take from every one or from
-- none.
local args = {}
for i = 1, n do
  local R, P, B, c, Tq, Tr = check(tonumber(ARGV[4 * i - 3]), tonumber(ARGV[4 * i - 2]),
    tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i]))
  if not R then
    return redis.error_reply(P)
  end
  args[i] = {R, P, B, c, Tq, Tr}
end
local now = clock()
local state = {}
local all = true
for i = 1, n do
  local a = args[i]
  local du, df, cu, cf, nu, nf, retry = read(redis.call('GET', KEYS[i]), a[1], a[3], a[4], a[5], a[6], now)
  state[i] = {du, df, cu, cf, nu, nf, retry}
  if retry > 0 then
    all = false
  end
end
local reply = {}
for i = 1, n do
  local a, st = args[i], state[i]
  local du, df = st[1], st[2]
  if all then
    du, df = write(KEYS[i], a[1], a[4], now, du, df, st[5], st[6])
  end
  reply[4 * i - 3] = all and 1 or 0
  reply[4 * i - 2] = remaining(a[1], a[2], a[3], a[5], a[6], st[3], st[4], du, df)
  reply[4 * i - 1] = st[7]
  reply[4 * i] = ceil(du, df)
end
return reply
