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
--              Limits: B*R <= 2^50 and B*ceil(P/R) <= 2^50 (microseconds).
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

-- Check every bucket's arguments before reading or writing anything.
local buckets = {}
for i = 1, n do
  local R = tonumber(ARGV[4 * i - 3])
  local P = tonumber(ARGV[4 * i - 2])
  local B = tonumber(ARGV[4 * i - 1])
  local c = tonumber(ARGV[4 * i])
  if not (R and P and B and c) or R < 1 or P < 1 or B < 1 or c < -B or c > B
      or R % 1 ~= 0 or P % 1 ~= 0 or B % 1 ~= 0 or c % 1 ~= 0 then
    return redis.error_reply('ERR tollgate: invalid arguments')
  end
  local Tq, Tr = divmod(P, R) -- emission interval T = P/R = Tq + Tr/R
  if B * R > LIMIT or B * (Tq + 1) > LIMIT then
    return redis.error_reply('ERR tollgate: limit out of range')
  end
  buckets[i] = {key = KEYS[i], R = R, P = P, B = B, c = c, Tq = Tq, Tr = Tr}
end

-- k*T as a pair, for bucket b.
local function times(b, k)
  local q, r = divmod(k * b.Tr, b.R)
  return k * b.Tq + q, r
end

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: allow writes after TIME
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Read every bucket: its debt D = max(TAT - now, 0), how far it is from
-- full, and whether it holds its c tokens.
local all = true
for _, b in ipairs(buckets) do
  local R = b.R
  local du, df = 0, 0
  local v = redis.call('GET', b.key)
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
  local cu, cf = times(b, b.B) -- capacity as time: B*T
  if not le(du, df, cu, cf) then
    du, df = cu, cf -- state left by a larger limit: read as an empty bucket
  end
  local nu, nf
  if b.c >= 0 then
    local ku, kf = times(b, b.c)
    nu, nf = add(R, du, df, ku, kf)
  else -- a refund: D - (-c)*T, not below 0 (full)
    local ku, kf = times(b, -b.c)
    nu, nf = 0, 0
    if le(ku, kf, du, df) then
      nu, nf = sub(R, du, df, ku, kf)
    end
  end
  b.du, b.df, b.cu, b.cf, b.nu, b.nf = du, df, cu, cf, nu, nf
  b.retry = 0
  if b.c > 0 and not le(nu, nf, cu, cf) then
    b.retry = ceil(sub(R, nu, nf, cu, cf))
    all = false
  end
end

-- Take from every bucket, or from none.
if all then
  for _, b in ipairs(buckets) do
    if b.c < 0 and b.nu == 0 and b.nf == 0 then
      b.du, b.df = 0, 0
      redis.call('DEL', b.key) -- full again: a full bucket is no key
    elseif b.c ~= 0 then
      b.du, b.df = b.nu, b.nf
      local tu, tf = add(b.R, now, 0, b.du, b.df)
      local state = string.format('%.0f', tu)
      if tf > 0 then
        state = state .. '+' .. string.format('%.0f', tf) .. '/' .. string.format('%.0f', b.R)
      end
      local ttl = math.ceil(ceil(b.du, b.df) / 1000)
      if ttl < 1 then
        ttl = 1
      end
      redis.call('SET', b.key, state, 'PX', ttl)
    end
  end
end

local reply = {}
for i, b in ipairs(buckets) do
  -- Remaining: the largest k <= B with D + k*T <= B*T.
  local au, af = sub(b.R, b.cu, b.cf, b.du, b.df)
  local k = math.floor((au + af / b.R) * b.R / b.P)
  if k < 0 then k = 0 end
  if k > b.B then k = b.B end
  local function fits(m) -- m*T <= A
    local xu, xf = times(b, m)
    return le(xu, xf, au, af)
  end
  while k > 0 and not fits(k) do
    k = k - 1
  end
  while k < b.B and fits(k + 1) do
    k = k + 1
  end
  reply[4 * i - 3] = all and 1 or 0
  reply[4 * i - 2] = k
  reply[4 * i - 1] = b.retry
  reply[4 * i] = ceil(b.du, b.df)
end
return reply
