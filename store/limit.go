package store

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// ErrInvalidLimit is wrapped by the error for a Limit failing [Limit.Validate].
var ErrInvalidLimit = errors.New("invalid limit")

// ErrInvalidCost is wrapped by Take's error for a cost below 0 or above Burst:
// such a cost never succeeds, so it is an error, not a denial saying "retry".
var ErrInvalidCost = errors.New("invalid cost")

// Limit is a token bucket of capacity Burst refilled with Rate tokens per
// Period, or with a [Window] a quota of Rate per window: a plain value passed
// on every call, so one store serves every route and tier.
type Limit struct {
	Rate   int           // tokens added per Period, at least 1
	Period time.Duration // at least 1µs, a whole number of microseconds
	Burst  int           // bucket capacity, at least 1; a window's: Rate
	Window *Window       // nil: a token bucket; else [Fixed], [Sliding], [Monthly] or one In a Location
}

// PerSecond returns a Limit of rate tokens per second with Burst = rate.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Period: time.Second, Burst: rate} }

// PerMinute returns a Limit of rate tokens per minute with Burst = rate.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Period: time.Minute, Burst: rate} }

// PerHour returns a Limit of rate tokens per hour with Burst = rate.
func PerHour(rate int) Limit { return Limit{Rate: rate, Period: time.Hour, Burst: rate} }

// Validate reports whether the stores can decide l exactly: Rate and Burst at
// least 1, Period a positive whole number of µs, and Burst*Rate and
// Burst*Period/gcd(Rate, Period µs) at most 2^50. The error wraps
// [ErrInvalidLimit] and names the field.
func (l Limit) Validate() error { _, err := newParams(l); return err }

// ValidateDelay reports whether a [Delayer] can take l's tokens up to
// maxDelay (at least 0) ahead, within the bounds of Validate. The error
// wraps [ErrInvalidLimit].
func (l Limit) ValidateDelay(maxDelay time.Duration) error { return l.validate(maxDelay, false) }

// ValidateBlock reports whether an [Admin] can block l's bucket for d
// (positive), within the bounds of Validate. The error wraps [ErrInvalidLimit].
func (l Limit) ValidateBlock(d time.Duration) error { return l.validate(d, true) }

func (l Limit) validate(d time.Duration, block bool) error {
	p, err := newParams(l)
	if err == nil {
		_, err = p.extend(d, block)
	}
	return err
}

// Admin is what an operator (or middleware.WithPenalty) needs beyond Take.
type Admin interface {
	// Reset forgets key's bucket (it is full) and its count under each
	// window quota of quotas. An invalid quota is an error; nothing is reset.
	Reset(ctx context.Context, key string, quotas ...Limit) error
	// Block makes key's bucket under limit refuse every cost above 0 for d
	// on top of its debt, then refill; Reset ends it. A Block the bucket
	// cannot hold is an error ([ErrBlockTooLong]) and writes nothing.
	Block(ctx context.Context, key string, limit Limit, d time.Duration) error
}

// Inspect reads key's bucket under limit without taking from it and says
// what a Take of cost would answer now, RetryAfter rounded up to the µs: from
// the Result of a read, whose ResetAfter is rounded up already, it may be 1 µs
// later than the Take's (a denied window quota's is its ResetAfter: at most
// that for a sliding one).
func Inspect(ctx context.Context, s Store, key string, limit Limit, cost int) (Result, error) {
	if err := limit.Validate(); err != nil {
		return Result{}, err
	}
	if cost < 0 || cost > limit.Burst {
		return Result{}, fmt.Errorf("store: inspect %q: %w: cost %d is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, cost, limit.Burst, limit)
	}
	res, err := s.Take(ctx, key, limit, 0)
	if err != nil {
		return res, err
	}
	res.Allowed = res.Remaining >= cost
	if !res.Allowed && limit.Window != nil {
		res.RetryAfter = res.ResetAfter
	} else if !res.Allowed { // until cost tokens: ResetAfter less the time of Burst-cost
		hi, lo := bits.Mul64(uint64(limit.Burst-cost), uint64(limit.Period))
		room, _ := bits.Div64(hi, lo, uint64(limit.Rate)) // Burst*Period/Rate fits: Limit.Validate
		wait := res.ResetAfter - time.Duration(room)
		res.RetryAfter = max((wait + time.Microsecond - 1).Truncate(time.Microsecond), time.Microsecond)
	}
	return res, nil
}

// String returns a compact form of l, such as "100/1m0s burst 10".
func (l Limit) String() string {
	switch {
	case l.Window == nil:
		return fmt.Sprintf("%d/%s burst %d", l.Rate, l.Period, l.Burst)
	case l.Window.kind == monthly:
		return fmt.Sprintf("%d per month in %s", l.Rate, l.Window.loc)
	}
	return fmt.Sprintf("%d per %s window of %s in %s", l.Rate, l.Window, l.Period, l.Window.loc)
}

func (l Limit) invalid(format string, args ...any) error {
	return fmt.Errorf("store: %w %v: %s", ErrInvalidLimit, l, fmt.Sprintf(format, args...))
}

// Result is the outcome of one decision.
type Result struct {
	Limit      Limit
	Allowed    bool
	Remaining  int           // whole tokens left after this decision
	RetryAfter time.Duration // denied: time until this cost can succeed; allowed: 0
	ResetAfter time.Duration // time until the bucket is full again
	Delay      time.Duration // allowed ahead of its tokens ([Delayer]): the time until they are due
	Next       time.Duration // a window quota's time until its count falls (0: none counted)
}

// Store decides limits, safely for concurrent use. Take takes cost tokens
// from the bucket named key under limit if all are there (0 reads it); over
// the limit is Allowed false, consuming nothing. Errors are for an invalid
// limit or cost ([ErrInvalidLimit], [ErrInvalidCost]) or a broken store.
type Store interface {
	Take(ctx context.Context, key string, limit Limit, cost int) (Result, error)
}

// Delayer is a [Store] that can take tokens ahead of time, for requests that
// wait for them (middleware.WithDelay).
type Delayer interface {
	// TakeDelayed is Take, but tokens due within maxDelay are taken now and
	// the Result allows after its Delay; one that would wait longer is
	// denied, consuming nothing, its RetryAfter until it would be taken. A
	// maxDelay below 0 is an error.
	TakeDelayed(ctx context.Context, key string, limit Limit, cost int, maxDelay time.Duration) (Result, error)
}
