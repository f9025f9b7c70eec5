package store

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// Memory runs here the arithmetic of the lua package doc (TAT, debt D, units of
// 1/q µs, a token t units, cap = Burst*t).

// maxProduct bounds Burst*Rate and cap: exact in int64 and in Lua's doubles.
const maxProduct = 1 << 50

// params is a valid Limit in those units, script arguments boxed once. A
// Take fits if the debt stays within fit: cap, or more for one that may wait.
type params struct {
	l              Limit
	q, t, cap, fit int64
	fitUs          int64  // fit/q+1: a debt of more whole µs exceeds fit
	block          int64  // > 0: the units a Block adds, whatever the cost
	args           [2]any // fit and q
	k1             any    // t: the k of a cost of 1
	// A window quota's (window.go): Period in µs, calendar (nil: from the
	// epoch), the name of its kind, which keys its state, the window bounds
	// of one Redis call (none: from the epoch, found on Redis's clock), and
	// the script's kind and period for windows from the epoch, boxed once.
	period int64
	loc    *time.Location
	spec   string
	b      [4]int64
	epoch  [2]any
}

func newParams(l Limit) (*params, error) {
	switch {
	case l.Window != nil:
		return windowParams(l)
	case l.Rate < 1:
		return nil, l.invalid("Rate must be at least 1, got %d", l.Rate)
	case l.Burst < 1:
		return nil, l.invalid("Burst must be at least 1, got %d", l.Burst)
	case l.Period < time.Microsecond || l.Period%time.Microsecond != 0:
		return nil, l.invalid("Period must be a positive whole number of microseconds, got %s", l.Period)
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

// extend returns p for a Take that may fill the bucket up to d beyond its
// capacity (Result.Delay: until it is within), or for a Block adding cap + d
// units to the debt whatever the cost.
func (p *params) extend(d time.Duration, block bool) (params, error) {
	x := *p
	if d == 0 && !block {
		return x, nil // the boxed arguments as they are: boxing an integer allocates
	}
	hi, lo := bits.Mul64(uint64(max(d, 0)/time.Microsecond), uint64(p.q))
	if d < 0 || block && d == 0 || hi != 0 || lo > maxProduct-uint64(p.fit) || p.spec != "" {
		what := "MaxDelay"
		if block {
			what = "Block"
		}
		return x, p.l.invalid("%s %s: it must be positive (a MaxDelay may be 0), within 2^50 units with the bucket, and the limit a token bucket", what, d)
	}
	x.fit += int64(lo)
	if block {
		x.block, x.fit = x.fit, maxProduct
	}
	x.fitUs, x.args[0] = x.fit/x.q+1, x.fit
	return x, nil
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

// fill puts in res the Result of debt (du, df) after a decision of k units;
// denied, RetryAfter is when k fits (0: now, another bucket of a TakeAll
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

// units returns limit's params and n tokens' units (refund: negative).
func (c *limitCache) units(key string, limit Limit, n int, refund bool) (*params, int64, error) {
	p, err := c.get(limit)
	if err != nil {
		return nil, 0, err
	}
	if n < 0 || n > limit.Burst {
		op := "take"
		if refund {
			op = "refund"
		}
		return nil, 0, fmt.Errorf("store: %s %q: %w: %d tokens is outside [0, %d] (Burst of %v)", op, key, ErrInvalidCost, n, limit.Burst, limit)
	}
	if refund {
		n = -n
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
