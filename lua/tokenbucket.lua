-- tollgate token bucket, version 3.
--
-- A token bucket of capacity B refilled continuously at R tokens per P
-- microseconds, kept as GCRA state: the bucket's "theoretical arrival time"
-- (TAT), the instant at which the bucket will be full again. A missing key is
-- a full bucket. All arithmetic is on integers; the clock is Redis's own
-- (TIME), never an app server's.
--
-- Two forms of call.
--
-- The one-key form (version 3) takes the limit in the units of the debt, so
-- that Redis, which every app server shares, does as little as it can: the
-- caller computes them once per limit, and remaining, retry and reset from
-- the reply.
-- A debt counts in units of 1/Q microsecond, where Q/t is R/P in lowest
-- terms (Q = R/gcd(R, P), t = P/gcd(R, P)): one token, T = P/R
-- microseconds, is t units.
-- KEYS[1]      the bucket key
-- ARGV[1]      cap = B*t, the bucket's capacity as a debt
-- ARGV[2]      k = c*t, what taking c tokens adds to the debt (c = 0 reads,
--              c < 0 gives -c tokens back, never above capacity)
-- ARGV[3]      Q, when it is not 1 (when R does not divide P)
--              Integers in decimal, 1 <= cap <= 2^50, -cap <= k <= cap,
--              1 <= Q <= 2^50.
-- Reply: one integer. D >= 0: allowed (always when k <= 0), and D is the debt
-- after the decision; -1-D < 0: denied, and D is the debt, unchanged. The
-- bucket then holds floor((cap - D) / t) whole tokens, is full again in
-- ceil(D/Q) microseconds, and after a denial holds c tokens in
-- ceil((D + k - cap)/Q) microseconds.
--
-- The general form (version 2) decides n >= 1 buckets together, all or
-- nothing. For bucket i (1-based):
-- KEYS[i]      the bucket key. One key per bucket; the keys are distinct, and
--              on Redis Cluster they share a {hash tag}.
-- ARGV[4i-3]   R, rate: tokens added per period, integer >= 1
-- ARGV[4i-2]   P, period in microseconds, integer >= 1
-- ARGV[4i-1]   B, burst: capacity in tokens, integer >= 1
-- ARGV[4i]     c, cost: tokens to take, integer, -B <= c <= B; a negative c
--              gives -c tokens back (a refund), never above capacity
--              Limits: B*R <= 2^50 and B*(floor(P/R)+1) <= 2^50 (microseconds).
-- The c tokens of every bucket are taken if every bucket has them (a refund
-- always fits); otherwise none is taken, none given back, nothing written.
-- Reply: an array of 4n integers, four per bucket in KEYS order:
--   [4i-3] allowed         1 if the tokens were taken (always 1 when no
--                          c > 0), else 0 — the same for every bucket
--   [4i-2] remaining       whole tokens left in bucket i after this decision
--   [4i-1] retry_after_us  microseconds until bucket i holds its c tokens
--                          (rounded up); 0 when it holds them now
--   [4i]   reset_after_us  microseconds until bucket i is full again (rounded up)
--
-- Either form answers arguments out of range with an error reply starting
-- with "ERR tollgate:" (the one-key form raises a script error for
-- arguments that are not numbers at all).
--
-- State, the string value of KEYS[i], the same for both forms:
--   "<tat>"              TAT in whole microseconds of Redis's clock, or
--   "<tat>+<f>/<Q>"      TAT plus f/Q of a microsecond (0 < f < Q), used when
--                        P is not a multiple of R; Q = R/gcd(R, P).
-- A value that does not parse is treated as a full bucket and replaced; a
-- value further from full than B*T (left by a larger limit on the same key)
-- is read as an empty bucket, and written as one by a call it denies, so
-- that the next call sees what the denial answered; a fraction of another
-- rate is rounded up.
--
-- Invariants:
--   * c tokens are taken only when all c are there, in every bucket; a
--     denial writes nothing (but the state left by a larger limit, above);
--     c = 0 reads the bucket and writes nothing; a refund that fills the
--     bucket deletes its key.
--   * Every write sets the key's expiry (PX) to the time until the bucket is
--     full again, so no key lives without a TTL and a full bucket is no key.
--   * A fraction of a microsecond is carried exactly: in units of 1/Q (one
--     key), or as pairs (u, f) meaning u + f/R microseconds with R and P in
--     lowest terms (general form; P above 2^53 stays as Lua reads it): the
--     same unit, 1 when R divides P.

local LIMIT = 1125899906842624 -- 2^50
local n, na = #KEYS, #ARGV

-- The one-key form. Every step costs Redis time that no app server can
-- take over, and a number parsed or formatted costs more than the
-- arithmetic: it parses what it is given, TIME and the state, and formats
-- the new state, nothing else.
if n == 1 and (na == 2 or na == 3) then
  local cap, k, q, Q = ARGV[1] + 0, ARGV[2] + 0, ARGV[3], 1
  if q then
    Q = q + 0
  end
  if not (cap >= 1 and cap <= LIMIT and k >= -cap and k <= cap and Q >= 1 and Q <= LIMIT
      and cap % 1 == 0 and k % 1 == 0 and Q % 1 == 0) then
    return redis.error_reply('ERR tollgate: invalid arguments')
  end
  if redis.replicate_commands then
    redis.replicate_commands() -- Redis < 5: allow writes after TIME
  end
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2] -- arithmetic converts once; tonumber would twice
  local v = redis.call('GET', KEYS[1])
  local d = 0 -- the debt D = TAT - now, at least 0, in units of 1/Q µs
  local clamped = false -- D was above cap
  if v then
    local tat, f = nil, 0
    if q then
      local su, sf, sd = string.match(v, '^(%d+)%+(%d+)/(%d+)$')
      if su then
        tat, f = su + 0, sf + 0
        if sd ~= q and sd + 0 ~= Q then -- q as given ("3.0"), the state as written ("3")
          tat, f = tat + 1, 0 -- a fraction of another rate: round up, never loosen
        elseif f >= Q then
          tat = false -- not a state: a full bucket
        end
      end
    end
    if tat == nil then
      tat = tonumber(v)
      if not tat then
        local su = string.match(v, '^(%d+)%+%d+/%d+$')
        if su then
          tat = su + 1 -- a fraction of another rate: round up
        end
      elseif tat % 1 ~= 0 and tat - tat == 0 then
        tat = tat - tat % 1 + 1 -- not written here: round up, never loosen
      end
    end
    if tat and tat == tat then -- not NaN; infinities are clamped below
      -- Above 2^53 the product is inexact, but then far above cap.
      d = (tat - now) * Q + f
      if d < 0 then
        d = 0
      elseif d > cap then
        d, clamped = cap, true -- left by a larger limit: an empty bucket
      end
    end
  end
  local nd = d + k
  local denied = k > 0 and nd > cap
  if denied then
    if not clamped then
      return -1 - d
    end
    nd = d
  end
  -- A denial writes the empty bucket a larger limit's state was read as:
  -- the next call then sees what this one answered.
  if k ~= 0 then
    if nd <= 0 then
      nd = 0
      redis.call('DEL', KEYS[1]) -- full again: a full bucket is no key
    else
      -- TAT = now + nd/Q = x + f/Q. Division by % and exact subtraction
      -- (nd < 2^52): no call to math.floor. Formatted in two halves with
      -- '%d', cheaper than '%.0f', and within 32 bits (Lua's '%d' goes
      -- through a C long) until the year 8000.
      local f = nd % Q
      local x = now + (nd - f) / Q
      local lo = x % 100000000
      local hi = (x - lo) / 100000000
      local state
      if hi == 0 then -- a clock before 1970-01-01 00:01:40
        state = string.format('%.0f', x)
        if f > 0 then
          state = state .. string.format('+%.0f/%.0f', f, Q)
        end
      elseif f == 0 then
        state = string.format('%d%08d', hi, lo)
      elseif Q <= 2147483647 then -- Q in digits, whatever text it came as
        state = string.format('%d%08d+%d/%d', hi, lo, f, Q)
      else
        state = string.format('%d%08d+%.0f/%.0f', hi, lo, f, Q)
      end
      local m = Q * 1000 -- the TTL: nd/Q µs in milliseconds, rounded up
      local r = nd % m
      local ttl = (nd - r) / m
      if r > 0 then
        ttl = ttl + 1
      end
      if ttl >= 100000000 then
        -- Redis 7.2.0 to 7.2.4 send a Lua number of 10^8 or more with many
        -- trailing zeros (1e8, 2e8, 1.5e9) as "1e+08"-like text, which SET
        -- refuses; below 10^8 a number always goes in full digits.
        ttl = string.format('%.0f', ttl)
      end
      redis.call('SET', KEYS[1], state, 'PX', ttl)
    end
  end
  if denied then
    return -1 - d
  end
  return nd
end

if n < 1 or na ~= 4 * n then
  return redis.error_reply('ERR tollgate: want 2 or 3 arguments for one key, or 4 per key')
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

-- check takes a bucket's arguments as tonumber gives them and returns R, P
-- (in lowest terms), B, c and T = P/R as Tq + Tr/R, or nil and an error
-- message.
local function check(R, P, B, c)
  if not (R and P and B and c) or R < 1 or P < 1 or B < 1 or c < -B or c > B
      or R % 1 ~= 0 or P % 1 ~= 0 or B % 1 ~= 0 or c % 1 ~= 0 then
    return nil, 'ERR tollgate: invalid arguments'
  end
  local Tq, Tr = divmod(P, R)
  if B * R > LIMIT or B * (Tq + 1) > LIMIT then
    return nil, 'ERR tollgate: limit out of range'
  end
  -- R and P in lowest terms (T is the same): a fraction of a microsecond
  -- counts in 1/R, the coarsest unit that keeps it exact (R = 1 when R
  -- divided P), as in the one-key form and the Memory store. Above 2^53 %
  -- is not exact, and such a P stays as tonumber read it.
  if P <= 9007199254740992 then
    local a, b = R, P
    while b > 0 do -- not a, b = b, a % b: gopher-lua (miniredis) assigns a first
      local r = a % b
      a = b
      b = r
    end
    R, P, Tr = R / a, P / a, Tr / a
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
  local clamped = not le(du, df, cu, cf)
  if clamped then
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
  return du, df, cu, cf, nu, nf, retry, clamped
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
  local du, df, cu, cf, nu, nf, retry, clamped = read(redis.call('GET', KEYS[i]), a[1], a[3], a[4], a[5], a[6], now)
  state[i] = {du, df, cu, cf, nu, nf, retry, clamped}
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
  if st[8] and a[4] > 0 and not all then
    -- Read as an empty bucket and denied: written as one, so that the
    -- next call sees what this one answers.
    write(KEYS[i], a[1], a[4], now, du, df, du, df)
  end
  reply[4 * i - 3] = all and 1 or 0
  reply[4 * i - 2] = remaining(a[1], a[2], a[3], a[5], a[6], st[3], st[4], du, df)
  reply[4 * i - 1] = st[7]
  reply[4 * i] = ceil(du, df)
end
return reply
