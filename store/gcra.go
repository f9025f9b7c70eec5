package store

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// The bucket arithmetic, shared by both stores: Memory runs it here, and
// lua/tokenbucket.lua runs the same steps in Redis, whose reply Redis.Take
// turns into a Result with the same function (result) as Memory.
//
// A bucket's state is its theoretical arrival time (TAT): the instant at
// which it is full again. Its debt D = TAT - now, at least 0, is how far it
// is from full. Time counts in units of 1/q microsecond, in which one token
// takes t units exactly (t/q is Period/Rate in lowest terms), so a bucket
// holds cap = Burst*t. Taking c tokens succeeds iff D + c*t <= cap, and then
// TAT becomes max(TAT, now) + c*t. That is the whole rule; it never lowers
// a TAT, so a stale now (a goroutine preempted after reading the clock), or
// a decision under another Limit on the same key, can only deny, never hand
// tokens back. Only a refund lowers it.

// maxProduct bounds Burst*Rate and cap, so that the arithmetic stays exact
// in int64 and in the doubles of Redis's Lua (exact to 2^53).
const maxProduct = 1 << 50

// params is a valid Limit in the units of the arithmetic, with the values
// the script takes boxed once (boxing an integer above 255 allocates).
type params struct {
	l         Limit
	q, t, cap int64
	capUs     int64  // cap/q + 1: a debt of more whole microseconds is above cap
	args      [2]any // cap and q, for the script
	k1        any    // t: the script's k for a cost of 1
}

func newParams(l Limit) (*params, error) {
	switch {
	case l.Rate < 1:
		return nil, l.invalid("Rate must be at least 1, got %d", l.Rate)
	case l.Burst < 1:
		return nil, l.invalid("Burst must be at least 1, got %d", l.Burst)
	case l.Period < time.Microsecond:
		return nil, l.invalid("Period must be at least 1µs, got %s", l.Period)
	case l.Period%time.Microsecond != 0:
		return nil, l.invalid("Period must be a whole number of microseconds, got %s", l.Period)
	}
	rate, period, burst := int64(l.Rate), l.Period.Microseconds(), int64(l.Burst)
	g := gcd(rate, period)
	p := &params{l: l, q: rate / g, t: period / g}
	if hi, lo := bits.Mul64(uint64(rate), uint64(burst)); hi != 0 || lo > maxProduct {
		return nil, l.invalid("Burst*Rate must not exceed 2^50")
	}
	hi, lo := bits.Mul64(uint64(p.t), uint64(burst))
	if hi != 0 || lo > maxProduct {
		return nil, l.invalid("Burst*Period/gcd(Rate, Period in µs) must not exceed 2^50")
	}
	p.cap = int64(lo)
	p.capUs = p.cap/p.q + 1
	p.args, p.k1 = [2]any{p.cap, p.q}, p.t
	return p, nil
}

func gcd(a, b int64) int64 {
	for b > 0 {
		a, b = b, a%b
	}
	return a
}

// tat is a bucket's state: TAT = u + f/q microseconds. The zero value (q 0)
// is a bucket with no state, which is full.
type tat struct{ u, f, q int64 }

// debt returns how far a bucket in state s is from full at now: du whole
// microseconds and df/p.q of one. A fraction counted in another Limit's
// units is rounded up, never down.
func (p *params) debt(s tat, now int64) (du, df int64) {
	u, f := s.u, s.f
	if s.q != p.q && f > 0 {
		u, f = u+1, 0
	}
	if s.q == 0 || u < now || (u == now && f == 0) {
		return 0, 0
	}
	return u - now, f
}

// fits reports whether k units (k = cost*t) fit in a bucket whose debt is
// (du, df); k <= 0, a read or a refund, always does.
func (p *params) fits(du, df, k int64) bool {
	return k <= 0 || (du <= p.capUs && du*p.q+df+k <= p.cap)
}

// after returns the debt (du, df) once k units are added (taken) or, when k
// is negative, given back, never below 0.
func (p *params) after(du, df, k int64) (int64, int64) {
	if k >= 0 {
		if p.q == 1 { // the rate divides the period: no fractions, no division
			return du + k, 0
		}
		f := df + k
		return du + f/p.q, f % p.q
	}
	du, df = du-(-k)/p.q, df-(-k)%p.q
	if df < 0 {
		du, df = du-1, df+p.q
	}
	if du < 0 {
		return 0, 0
	}
	return du, df
}

// state is the TAT of a debt (du, df) at now; ok is false for no debt,
// which is a full bucket, stored as no state at all.
func (p *params) state(du, df, now int64) (s tat, ok bool) {
	return tat{now + du, df, p.q}, du > 0 || df > 0
}

// result describes a bucket whose debt is (du, df) after a decision of k
// units. When the decision was not allowed, RetryAfter is the time until k
// units fit (0 when they fit now: a TakeAll that another bucket denied).
func (p *params) result(du, df, k int64, allowed bool) Result {
	var res Result
	p.fill(&res, du, df, k, allowed)
	return res
}

// fill is result into res: the Memory store fills in its caller's Result,
// which saves copying one (a tenth of a decision, measured on one hot key).
func (p *params) fill(res *Result, du, df, k int64, allowed bool) {
	res.Limit, res.Allowed, res.ResetAfter = p.l, allowed, micros(du)
	if df > 0 { // 0 <= df < q: rounded up, a microsecond more
		res.ResetAfter += time.Microsecond
	}
	res.Remaining = 0
	if du <= p.capUs {
		if left := p.cap - du*p.q - df; left > 0 && p.t == 1 {
			res.Remaining = int(left)
		} else if left > 0 {
			res.Remaining = int(left / p.t)
		}
	}
	res.RetryAfter = 0
	if !allowed && k > 0 {
		// D + k - cap, in whole microseconds rounded up.
		res.RetryAfter = micros(max(du+ceilDiv(df+k-p.cap, p.q), 0))
	}
}

// ceilDiv is a/b rounded up, for any a and b >= 1 (Go's / rounds toward
// zero, which is up for a negative a).
func ceilDiv(a, b int64) int64 {
	if a > 0 && a%b != 0 {
		return a/b + 1
	}
	return a / b
}

func micros(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// limitCache keeps the params of recently used Limits, so that a decision
// neither validates its Limit again nor allocates: a store serving up to 16
// Limits computes each once. A Limit beyond those replaces one in turn.
type limitCache struct {
	slots [16]atomic.Pointer[params]
	next  atomic.Uint32
}

// units returns limit's params and the units of n tokens, negative when
// they are given back (refund), or the error for an invalid limit or n.
func (c *limitCache) units(key string, limit Limit, n int, refund bool) (*params, int64, error) {
	p, err := c.get(limit)
	switch {
	case err != nil:
		return nil, 0, err
	case (n < 0 || n > limit.Burst) && refund:
		return nil, 0, refundError(key, limit, n)
	case n < 0 || n > limit.Burst:
		return nil, 0, costError(key, limit, n)
	case refund:
		return p, -int64(n) * p.t, nil
	}
	return p, int64(n) * p.t, nil
}

func (c *limitCache) get(l Limit) (*params, error) {
	for i := range c.slots {
		if p := c.slots[i].Load(); p != nil && p.l == l {
			return p, nil
		}
	}
	p, err := newParams(l)
	if err != nil {
		return nil, err
	}
	c.slots[c.next.Add(1)%uint32(len(c.slots))].Store(p)
	return p, nil
}
