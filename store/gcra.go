package store

import (
	"math/bits"
	"time"
)

// The arithmetic here is the Go twin of lua/tokenbucket.lua; the two must
// give identical answers (the conformance suite checks it). Time is in
// microseconds. A span (u, f) is u + f/rate microseconds with 0 <= f < rate,
// which keeps a period that rate does not divide exact; rate/period is in
// lowest terms, so that a fraction counts in the coarsest exact unit, the
// one the script's state names (1 when the rate divides the period).

// params is a validated Limit in the units of the arithmetic.
type params struct {
	rate, period, burst int64 // rate per period microseconds, in lowest terms
	g                   int64 // the Limit's Rate is rate*g, its Period period*g µs
	tq, tr              int64 // emission interval period/rate = tq + tr/rate
}

func (l Limit) params() (params, error) {
	switch {
	case l.Rate < 1:
		return params{}, l.invalid("Rate must be at least 1, got %d", l.Rate)
	case l.Burst < 1:
		return params{}, l.invalid("Burst must be at least 1, got %d", l.Burst)
	case l.Period < time.Microsecond:
		return params{}, l.invalid("Period must be at least 1µs, got %s", l.Period)
	case l.Period%time.Microsecond != 0:
		return params{}, l.invalid("Period must be a whole number of microseconds, got %s", l.Period)
	}
	p := params{rate: int64(l.Rate), period: l.Period.Microseconds(), burst: int64(l.Burst), g: 1}
	p.tq, p.tr = p.period/p.rate, p.period%p.rate
	// Multiplications, not divisions, on the hot path: both factors are
	// positive, so a product fits in 64 bits when its high word is 0.
	if hi, lo := bits.Mul64(uint64(p.rate), uint64(p.burst)); hi != 0 || lo > maxProduct {
		return params{}, l.invalid("Burst*Rate must not exceed 2^50")
	}
	if hi, lo := bits.Mul64(uint64(p.tq+1), uint64(p.burst)); hi != 0 || lo > maxProduct {
		return params{}, l.invalid("the time to refill Burst tokens must not exceed 2^50µs")
	}
	// In lowest terms, as the script does: above 2^53 its arithmetic on the
	// period is not exact, and it leaves such a period as it is.
	if p.period <= 1<<53 {
		p.g = gcd(p.rate, p.period)
		p.rate, p.period, p.tr = p.rate/p.g, p.period/p.g, p.tr/p.g
	}
	return p, nil
}

func gcd(a, b int64) int64 {
	for b > 0 {
		a, b = b, a%b
	}
	return a
}

type span struct{ u, f int64 }

// times returns n emission intervals.
func (p *params) times(n int64) span {
	if p.tr == 0 { // the rate divides the period: no fractions at all
		return span{n * p.tq, 0}
	}
	x := n * p.tr
	return span{n*p.tq + x/p.rate, x % p.rate}
}

func (a span) le(b span) bool { return a.u < b.u || (a.u == b.u && a.f <= b.f) }

func (p *params) add(a, b span) span {
	s := span{a.u + b.u, a.f + b.f}
	if s.f >= p.rate {
		s.u, s.f = s.u+1, s.f-p.rate
	}
	return s
}

func (p *params) sub(a, b span) span {
	s := span{a.u - b.u, a.f - b.f}
	if s.f < 0 {
		s.u, s.f = s.u-1, s.f+p.rate
	}
	return s
}

// ceil rounds a span up to whole microseconds.
func (a span) ceil() int64 {
	if a.f > 0 {
		return a.u + 1
	}
	return a.u
}

// bucket is the stored state: the theoretical arrival time (the instant the
// bucket is full again) and the rate its fraction is counted in.
type bucket struct {
	tat  span
	rate int64
}

// decide takes cost tokens at instant now from a bucket in state b (ok false:
// no state, a full bucket). It fills in res (all but Limit) and returns the
// new state when it must be written.
func (p *params) decide(res *Result, b bucket, ok bool, now, cost int64) (nb bucket, write bool) {
	var debt span // how far the bucket is from full
	if ok {
		tat := b.tat
		if b.rate != p.rate && tat.f > 0 {
			tat = span{tat.u + 1, 0} // stored under another rate: round up, never loosen
		}
		if n := (span{now, 0}); n.le(tat) {
			debt = p.sub(tat, n)
		}
	}
	capacity := p.times(p.burst)
	clamped := !debt.le(capacity)
	if clamped {
		// State left by a larger limit: an empty bucket of this one, which
		// a denial writes, so that the next decision reads what the denial
		// answered (its RetryAfter holds).
		debt = capacity
	}
	if cost < 0 { // a refund: give -cost tokens back, never above capacity
		res.Allowed = true
		if back := p.times(-cost); back.le(debt) {
			debt = p.sub(debt, back)
		} else {
			debt = span{}
		}
		if debt != (span{}) {
			nb, write = bucket{tat: p.add(span{now, 0}, debt), rate: p.rate}, true
		}
	} else if next := p.add(debt, p.times(cost)); cost == 0 || next.le(capacity) {
		res.Allowed = true
		if cost > 0 {
			debt = next
			nb, write = bucket{tat: p.add(span{now, 0}, debt), rate: p.rate}, true
		}
	} else {
		res.RetryAfter = time.Duration(p.sub(next, capacity).ceil()) * time.Microsecond
	}
	if clamped && cost > 0 {
		nb, write = bucket{tat: p.add(span{now, 0}, debt), rate: p.rate}, true
	}
	// Remaining = floor(A/T) with A = capacity - debt, T = period/rate:
	// floor((A.u*rate + A.f) / period), in 128 bits. The quotient is at
	// most burst, so it fits.
	a := p.sub(capacity, debt)
	var q uint64
	if p.tr == 0 {
		q = uint64(a.u / p.tq) // a.f is 0; tq >= 1 since period >= rate
	} else {
		hi, lo := bits.Mul64(uint64(a.u), uint64(p.rate))
		var carry uint64
		lo, carry = bits.Add64(lo, uint64(a.f), 0)
		q, _ = bits.Div64(hi+carry, lo, uint64(p.period))
	}
	res.Remaining = int(min(int64(q), p.burst))
	res.ResetAfter = time.Duration(debt.ceil()) * time.Microsecond
	return nb, write
}

// units is a Limit in the units of the script's one-key form
// (lua/tokenbucket.lua): a debt (how far a bucket is from full) counts in
// 1/q microsecond, one token is t of them, and the bucket holds cap = Burst*t.
// q/t is rate/period in lowest terms (q = 1 when the rate divides the
// period), as in params: the coarsest unit that keeps T exact, so the
// numbers Redis parses and formats are as short as they can be.
type units struct {
	t, q, cap int64
}

// units returns p in the one-key form's units; ok is false when the
// capacity is above 2^50 of them (a rate that does not divide a long period
// with a large burst), and the call takes the general form.
func (p *params) units() (u units, ok bool) {
	if p.tr == 0 {
		return units{t: p.tq, q: 1, cap: p.burst * p.tq}, true // burst*(tq+1) <= 2^50
	}
	if hi, lo := bits.Mul64(uint64(p.burst), uint64(p.period)); hi != 0 || lo > maxProduct {
		return units{}, false
	}
	return units{t: p.period, q: p.rate, cap: p.burst * p.period}, true
}

// result reads the one-key form's reply r to a decision that added k to the
// debt when allowed: the same Result as the general form's four integers
// (all but Limit). ok is false for a reply the script cannot give.
func (u *units) result(r, k int64) (res Result, ok bool) {
	debt := r
	if r < 0 {
		debt = -1 - r
	}
	if debt < 0 || debt > u.cap || (r < 0 && (k <= 0 || debt+k <= u.cap)) {
		return Result{}, false
	}
	u.fill(&res, r, k)
	return res, true
}

// fill sets all but res.Limit from a valid one-key reply r (see result):
// for a debt D after the decision, Remaining = floor((cap-D)/t),
// ResetAfter = ceil(D/q) µs and, when denied, RetryAfter =
// ceil((D+k-cap)/q) µs. It divides only by a t or q above 1: the Memory
// store calls it on every decision.
func (u *units) fill(res *Result, r, k int64) {
	res.Allowed = r >= 0
	debt := r
	if r < 0 {
		debt = -1 - r
	}
	left := u.cap - debt
	if u.t != 1 {
		left /= u.t
	}
	res.Remaining = int(left)
	res.ResetAfter = time.Duration(ceilDivUnit(debt, u.q)) * time.Microsecond
	res.RetryAfter = 0
	if r < 0 {
		res.RetryAfter = time.Duration(ceilDivUnit(debt+k-u.cap, u.q)) * time.Microsecond
	}
}

// ceilDivUnit is ceilDiv(a, q) without a division when q is 1.
func ceilDivUnit(a, q int64) int64 {
	if q == 1 {
		return a
	}
	return ceilDiv(a, q)
}

// ceilDiv is a/b rounded up, for a >= 0 and b >= 1.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
