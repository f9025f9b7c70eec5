-- tollgate token bucket, version 1.
--
-- A token bucket of capacity B refilled continuously at R tokens per P
-- microseconds, kept as GCRA state: the bucket's "theoretical arrival time"
-- (TAT), the instant at which the bucket will be full again. A missing key is
-- a full bucket. All arithmetic is on integers; the clock is Redis's own
-- (TIME), never an app server's.
--
-- KEYS[1]  the bucket key. One key per bucket; the script touches no other.
-- ARGV[1]  R, rate: tokens added per period, integer >= 1
-- ARGV[2]  P, period in microseconds, integer >= 1
-- ARGV[3]  B, burst: capacity in tokens, integer >= 1
-- ARGV[4]  c, cost: tokens to take, integer, 0 <= c <= B
--          Limits: B*R <= 2^50 and B*ceil(P/R) <= 2^50 (microseconds).
--
-- Reply: an array of four integers
--   [1] allowed         1 if the c tokens were taken (always 1 when c = 0), else 0
--   [2] remaining       whole tokens left after this decision
--   [3] retry_after_us  denied: microseconds until c tokens will be there
--                       (rounded up); allowed: 0
--   [4] reset_after_us  microseconds until the bucket is full again (rounded up)
-- or an error reply starting with "ERR tollgate:" for arguments out of range.
--
-- State, the string value of KEYS[1]:
--   "<tat>"              TAT in whole microseconds of Redis's clock, or
--   "<tat>+<f>/<R>"      TAT plus f/R of a microsecond (0 < f < R), used when
--                        P is not a multiple of R.
-- A value that does not parse is treated as a full bucket and replaced; a
-- value further from full than B*T (left by a larger limit on the same key)
-- is read as an empty bucket.
--
-- Invariants:
--   * c tokens are taken only when all c are there; a denial writes nothing;
--     c = 0 reads the bucket and writes nothing.
--   * Every write sets the key's expiry (PX) to the time until the bucket is
--     full again, so no key lives without a TTL and a full bucket is no key.
--   * Durations are pairs (u, f) meaning u + f/R microseconds, 0 <= f < R,
--     so rates that do not divide the period stay exact.

local key = KEYS[1]
local R = tonumber(ARGV[1])
local P = tonumber(ARGV[2])
local B = tonumber(ARGV[3])
local c = tonumber(ARGV[4])

local LIMIT = 1125899906842624 -- 2^50
if not (R and P and B and c) or R < 1 or P < 1 or B < 1 or c < 0 or c > B
    or R % 1 ~= 0 or P % 1 ~= 0 or B % 1 ~= 0 or c % 1 ~= 0 then
  return redis.error_reply('ERR tollgate: invalid arguments')
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

local Tq, Tr = divmod(P, R) -- emission interval T = P/R = Tq + Tr/R
if B * R > LIMIT or B * (Tq + 1) > LIMIT then
  return redis.error_reply('ERR tollgate: limit out of range')
end

-- n*T as a pair.
local function times(n)
  local q, r = divmod(n * Tr, R)
  return n * Tq + q, r
end
local function le(a, af, b, bf)
  return a < b or (a == b and af <= bf)
end
local function add(a, af, b, bf)
  local u, f = a + b, af + bf
  if f >= R then
    u, f = u + 1, f - R
  end
  return u, f
end
local function sub(a, af, b, bf)
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

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: allow writes after TIME
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Debt D = max(TAT - now, 0): how far the bucket is from full.
local du, df = 0, 0
local v = redis.call('GET', key)
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
    du, df = sub(tu, tf, now, 0)
  end
end

local cu, cf = times(B) -- capacity as time: B*T
if not le(du, df, cu, cf) then
  du, df = cu, cf -- state left by a larger limit: read as an empty bucket
end
local ku, kf = times(c)
local nu, nf = add(du, df, ku, kf)

local allowed, retry = 1, 0
if c == 0 or le(nu, nf, cu, cf) then
  if c > 0 then
    du, df = nu, nf
    local tu, tf = add(now, 0, du, df)
    local state = string.format('%.0f', tu)
    if tf > 0 then
      state = state .. '+' .. string.format('%.0f', tf) .. '/' .. string.format('%.0f', R)
    end
    local ttl = math.ceil(ceil(du, df) / 1000)
    if ttl < 1 then
      ttl = 1
    end
    redis.call('SET', key, state, 'PX', ttl)
  end
else
  allowed = 0
  retry = ceil(sub(nu, nf, cu, cf))
end

-- Remaining: the largest n <= B with D + n*T <= B*T.
local remaining = 0
do
  local au, af = sub(cu, cf, du, df)
  local n = math.floor((au + af / R) * R / P)
  if n < 0 then n = 0 end
  if n > B then n = B end
  local function fits(k) -- k*T <= A
    local xu, xf = times(k)
    return le(xu, xf, au, af)
  end
  while n > 0 and not fits(n) do
    n = n - 1
  end
  while n < B and fits(n + 1) do
    n = n + 1
  end
  remaining = n
end

return {allowed, remaining, retry, ceil(du, df)}
