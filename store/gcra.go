package store

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// Memory runs here the arithmetic of the lua package doc (TAT, debt D, units of
// 1/q µs, a token t units, cap = Burst*t): c tokens fit iff D + c*t <= cap, and
// then TAT becomes max(TAT, now) + c*t; only a refund lowers a TAT.

// maxProduct bounds Burst*Rate and cap, so that the arithmetic stays exact
// in int64 and in the doubles of Redis's Lua (exact to 2^53).
const maxProduct = 1 << 50

// params is a valid Limit in the arithmetic's units, script arguments boxed
// once. A Take fits if the debt stays within fit: cap, or more for a Take
// that may wait (delayed).
type params struct {
	l              Limit
	q, t, cap, fit int64
	fitUs          int64  // fit/q+1: a debt of more whole µs exceeds fit
	block          int64  // > 0: the units a Block adds, whatever the cost
	args           [2]any // fit and q, for the script
	k1             any    // t: the script's k for a cost of 1
	// A window quota's (see window.go): Period in µs, calendar (nil: from
	// the epoch), and the name of its kind, which keys its state.
	period int64
	loc    *time.Location
	spec   string
	b      [4]int64 // the window bounds of one Redis call
}

func newParams(l Limit) (*params, error) {
	switch {
	case l.Window != nil:
		return windowParams(l)
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
	g, b := rate, period // g = gcd(rate, period)
	for b > 0 {
		g, b = b, g%b
	}
	q, t := rate/g, period/g
	if hi, lo := bits.Mul64(uint64(rate), uint64(burst)); hi != 0 || lo > maxProduct {
		return nil, l.invalid("Burst*Rate must not exceed 2^50")
	}
	hi, lo := bits.Mul64(uint64(t), uint64(burst))
	if hi != 0 || lo > maxProduct {
		return nil, l.invalid("Burst*Period/gcd(Rate, Period in µs) must not exceed 2^50")
	}
	c := int64(lo) // the capacity
	return &params{l: l, q: q, t: t, cap: c, fit: c, fitUs: c/q + 1, args: [2]any{c, q}, k1: t}, nil
}

// delayed returns p for a Take that may fill the bucket up to maxDelay
// beyond its capacity, its Result.Delay the time until it is within.
func (p *params) delayed(maxDelay time.Duration) (params, error) {
	d := *p
	if maxDelay == 0 {
		return d, nil // the boxed arguments as they are: a boxed integer allocates
	}
	if maxDelay < 0 || p.spec != "" {
		return d, p.l.invalid("MaxDelay %s: it must not be negative, and is for token buckets", maxDelay)
	}
	hi, lo := bits.Mul64(uint64(maxDelay/time.Microsecond), uint64(p.q))
	if hi != 0 || lo > maxProduct-uint64(p.fit) {
		return d, p.l.invalid("MaxDelay %s: the bucket and its queue must not exceed 2^50 units", maxDelay)
	}
	d.fit += int64(lo)
	d.fitUs, d.args[0] = d.fit/d.q+1, d.fit
	return d, nil
}

// tat is a bucket's state, TAT = u + f/q µs; the zero value (q 0) is full.
type tat struct{ u, f, q int64 }

// debt returns s's debt at now, du + df/p.q µs, another q's fraction rounded up.
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

// blocking returns p for a Block of d: cap + d units added to the debt, in a
// bucket that holds up to 2^50.
func (p *params) blocking(d time.Duration) (params, error) {
	b := *p
	hi, lo := bits.Mul64(uint64(max(d, 0)/time.Microsecond), uint64(p.q))
	if d <= 0 || hi != 0 || lo > maxProduct-uint64(p.cap) || p.spec != "" {
		return b, p.l.invalid("Block %s: the duration must be positive, the bucket with it within 2^50 units, and the limit a token bucket", d)
	}
	b.block, b.fit = p.cap+int64(lo), maxProduct
	b.fitUs, b.args[0] = b.fit/b.q+1, b.fit
	return b, nil
}

// ErrBlockTooLong is wrapped by the error of a Block that the bucket cannot
// hold on top of its debt (2^50 units in all): it writes nothing.
var ErrBlockTooLong = errors.New("block too long for the bucket")

func errBlockFull(key string) error {
	return fmt.Errorf("store: block %q: %w on top of its debt: nothing written", key, ErrBlockTooLong)
}

// fits reports whether k = cost*t units fit in debt (du, df); k <= 0 always does.
func (p *params) fits(du, df, k int64) bool {
	return k <= 0 || (du <= p.fitUs && du*p.q+df+k <= p.fit)
}

// after returns the debt (du, df) plus k units (k < 0: given back, not below 0).
func (p *params) after(du, df, k int64) (int64, int64) {
	f := df + k
	du, df = du+f/p.q, f%p.q
	if df < 0 {
		du, df = du-1, df+p.q
	}
	if du < 0 {
		return 0, 0
	}
	return du, df
}

// fill puts in res the Result of debt (du, df) after a decision of k units; if
// denied, RetryAfter is when k fits (0 if now: a TakeAll another bucket
// denied). In place: copying a Result through two calls cost Memory's Take a
// third of a decision on one hot key (130-150 ns against 90-100, go test
// -bench PartsTake).
func (p *params) fill(res *Result, du, df, k int64, allowed bool) {
	res.Limit, res.Allowed, res.ResetAfter = p.l, allowed, micros(du)
	if df > 0 { // 0 <= df < q: rounded up, a microsecond more
		res.ResetAfter += time.Microsecond
	}
	res.Remaining = 0
	if left := p.cap - du*p.q - df; du <= p.fitUs && left > 0 {
		res.Remaining = int(left / p.t)
	}
	res.RetryAfter, res.Delay = 0, 0
	if !allowed && k > 0 {
		// D + k - fit, in whole microseconds rounded up.
		res.RetryAfter = micros(max(du+ceilDiv(df+k-p.fit, p.q), 0))
	} else if k > 0 && p.fit > p.cap && du*p.q+df > p.cap {
		res.Delay = micros(du + ceilDiv(df-p.cap, p.q)) // D - cap
	}
}

// ceilDiv is a/b rounded up, for b >= 1 (Go's / rounds a negative a up).
func ceilDiv(a, b int64) int64 {
	if a > 0 && a%b != 0 {
		return a/b + 1
	}
	return a / b
}

func micros(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// limitCache keeps the params of up to 16 recent Limits, so that a decision
// neither validates its Limit again nor allocates; more replace one another.
type limitCache struct {
	slots [16]atomic.Pointer[params]
	next  atomic.Uint32
}

// units returns limit's params and n tokens' units (< 0: refunded), or an error.
func (c *limitCache) units(key string, limit Limit, n int, refund bool) (*params, int64, error) {
	p, err := c.get(limit)
	switch {
	case err != nil:
		return nil, 0, err
	case (n < 0 || n > limit.Burst) && refund:
		return nil, 0, fmt.Errorf("store: refund %q: %w: %d tokens is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, n, limit.Burst, limit)
	case n < 0 || n > limit.Burst:
		return nil, 0, fmt.Errorf("store: take %q: %w: cost %d is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, n, limit.Burst, limit)
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
