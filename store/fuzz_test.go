package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/internal/race"
	"github.com/tollgate-go/tollgate/store"
)

// twin runs the Memory store and the Redis store (on miniredis) on the same
// controlled clock, so that their answers can be compared exactly.
type twin struct {
	mem     *store.Memory
	red     *store.Redis
	clock   *fakeClock
	advance func(time.Duration)
}

func newTwin(t testing.TB) *twin {
	tt, ok := t.(*testing.T)
	if !ok {
		panic("newTwin needs a *testing.T")
	}
	_, client, advance := newMiniredis(tt)
	clock := &fakeClock{now: epoch}
	m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(0))
	t.Cleanup(func() { m.Close() })
	return &twin{mem: m, red: store.NewRedis(client), clock: clock,
		advance: func(d time.Duration) { clock.Advance(d); advance(d) }}
}

// take decides on both stores and fails t unless they agree exactly.
func (tw *twin) take(t testing.TB, key string, lim store.Limit, cost int) (store.Result, error) {
	t.Helper()
	ctx := context.Background()
	rm, errm := tw.mem.Take(ctx, key, lim, cost)
	rr, errr := tw.red.Take(ctx, key, lim, cost)
	if (errm == nil) != (errr == nil) {
		t.Fatalf("Take(%q, %+v, %d): memory error %v, redis error %v", key, lim, cost, errm, errr)
	}
	for _, sentinel := range []error{store.ErrInvalidLimit, store.ErrInvalidCost} {
		if errors.Is(errm, sentinel) != errors.Is(errr, sentinel) {
			t.Fatalf("Take(%q, %+v, %d): memory error %v, redis error %v", key, lim, cost, errm, errr)
		}
	}
	if errm == nil && rm != rr {
		t.Fatalf("Take(%q, %+v, %d): memory %+v, redis %+v", key, lim, cost, rm, rr)
	}
	return rm, errm
}

// checkResult holds for every successful decision; alone says that the key
// was only ever decided under lim (under a larger limit, its bucket can be
// further from full than lim's capacity).
func checkResult(t testing.TB, lim store.Limit, cost int, r store.Result, alone bool) {
	t.Helper()
	bucket := time.Duration(float64(lim.Period) / float64(lim.Rate) * float64(lim.Burst) * (1 + 1e-12))
	switch {
	case r.Remaining < 0 || r.Remaining > lim.Burst:
		t.Fatalf("%+v cost %d: Remaining %d outside [0, Burst]", lim, cost, r.Remaining)
	case r.Allowed && r.RetryAfter != 0:
		t.Fatalf("%+v cost %d: allowed with RetryAfter %v", lim, cost, r.RetryAfter)
	case !r.Allowed && r.RetryAfter <= 0:
		t.Fatalf("%+v cost %d: denied with RetryAfter %v", lim, cost, r.RetryAfter)
	case !r.Allowed && r.Remaining >= cost:
		t.Fatalf("%+v cost %d: denied with %d remaining", lim, cost, r.Remaining)
	case r.ResetAfter < 0 || (alone && r.ResetAfter > bucket+time.Microsecond):
		t.Fatalf("%+v cost %d: ResetAfter %v outside [0, %v]", lim, cost, r.ResetAfter, bucket)
	}
}

func TestMemoryAndRedisAgree(t *testing.T) {
	tw := newTwin(t)
	rng := rand.New(rand.NewPCG(1, 2))
	limits := []store.Limit{
		store.PerSecond(5), store.PerSecond(3), store.PerMinute(7), store.PerHour(1000),
		{Rate: 7, Period: 3 * time.Second, Burst: 2},
		{Rate: 2_000_000, Period: time.Second, Burst: 9},
		{Rate: 1_000_000, Period: 24 * time.Hour, Burst: 1_000_000},
		{Rate: 1, Period: 24 * time.Hour, Burst: 3},
		// Fractions in the same unit (1/2 µs) and in others.
		{Rate: 2, Period: 3 * time.Microsecond, Burst: 9},
		{Rate: 4, Period: 6 * time.Microsecond, Burst: 9},
		{Rate: 4, Period: 5 * time.Microsecond, Burst: 9},
		{Rate: 10_000_000, Period: time.Second, Burst: 100},
	}
	for i := range 3000 {
		lim := limits[rng.IntN(len(limits))]
		key := "k" + strconv.Itoa(rng.IntN(4))
		cost := rng.IntN(lim.Burst + 1)
		if rng.IntN(4) == 0 {
			cost = rng.IntN(min(lim.Burst, 3) + 1)
		}
		r, err := tw.take(t, key, lim, cost)
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		checkResult(t, lim, cost, r, false)
		switch rng.IntN(3) {
		case 0:
			tw.advance(time.Duration(rng.IntN(1000)) * time.Microsecond)
		case 1:
			tw.advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
		}
	}
}

// One key decided under two limits: a fraction of a microsecond carries
// over exactly when both limits count it in the same unit (rate/period in
// lowest terms), and is rounded up otherwise; a state further from full
// than the second limit's capacity stays as it is, and the second limit
// waits for it — the same on both stores.
func TestMemoryAndRedisAgreeAcrossLimits(t *testing.T) {
	for _, c := range []struct {
		name   string
		first  store.Limit
		second store.Limit
	}{
		{"same unit, other rate", store.Limit{Rate: 2, Period: 3 * time.Microsecond, Burst: 9}, store.Limit{Rate: 4, Period: 6 * time.Microsecond, Burst: 9}},
		{"same rate, other unit", store.Limit{Rate: 4, Period: 6 * time.Microsecond, Burst: 9}, store.Limit{Rate: 4, Period: 5 * time.Microsecond, Burst: 9}},
		{"fraction, then whole", store.Limit{Rate: 3, Period: time.Second, Burst: 5}, store.PerSecond(5)},
		{"whole, then fraction", store.PerSecond(5), store.Limit{Rate: 3, Period: time.Second, Burst: 5}},
		{"larger, then smaller", store.Limit{Rate: 1, Period: time.Hour, Burst: 9}, store.PerSecond(5)},
		{"larger, then smaller, fractions", store.Limit{Rate: 3, Period: time.Hour, Burst: 5}, store.Limit{Rate: 3, Period: time.Second, Burst: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tw := newTwin(t)
			key := "k"
			for i := range 3 {
				tw.take(t, key, c.first, 1)
				tw.take(t, key, c.second, 1)
				tw.take(t, key, c.second, 0)
				tw.advance(time.Duration(i+1) * time.Microsecond)
			}
		})
	}
}

var fuzzKey atomic.Int64

// FuzzTake feeds arbitrary limits, costs and waits to both stores: neither
// panics, bad input is an error wrapping the right sentinel, and the two
// stores agree to the microsecond.
func FuzzTake(f *testing.F) {
	f.Add(5, int64(1_000_000), 5, 1, int64(0), 3)
	f.Add(3, int64(1_000_000), 3, 2, int64(333_333), 4)
	f.Add(0, int64(1_000_000), 5, 1, int64(0), 1)
	f.Add(1, int64(0), 1, 1, int64(0), 1)
	f.Add(1, int64(-5), 1, 1, int64(0), 1)
	f.Add(5, int64(1_000_000), 5, -1, int64(0), 1)
	f.Add(5, int64(1_000_000), 5, 6, int64(0), 1)
	f.Add(1<<30, int64(1_000_000), 1<<30, 1, int64(0), 1)
	f.Add(1_000_000, int64(86_400_000_000), 1_000_000, 1_000_000, int64(1), 3)
	f.Add(2_000_000, int64(1_000_000), 4, 3, int64(1), 5)
	f.Fuzz(func(t *testing.T, rate int, periodUs int64, burst, cost int, waitUs int64, n int) {
		if periodUs > 1<<53 || periodUs < -1<<53 || n > 20 {
			t.Skip()
		}
		tw := newTwin(t)
		lim := store.Limit{Rate: rate, Period: time.Duration(periodUs) * time.Microsecond, Burst: burst}
		key := "fuzz:" + strconv.FormatInt(fuzzKey.Add(1), 10)
		for range max(n, 1) {
			r, err := tw.take(t, key, lim, cost)
			switch {
			case lim.Validate() != nil:
				if !errors.Is(err, store.ErrInvalidLimit) {
					t.Fatalf("invalid %+v: error %v, want ErrInvalidLimit", lim, err)
				}
				return
			case cost < 0 || cost > burst:
				if !errors.Is(err, store.ErrInvalidCost) {
					t.Fatalf("cost %d of %+v: error %v, want ErrInvalidCost", cost, lim, err)
				}
				return
			case err != nil:
				t.Fatalf("%+v cost %d: %v", lim, cost, err)
			}
			checkResult(t, lim, cost, r, true)
			if waitUs > 0 && waitUs < 1<<40 {
				tw.advance(time.Duration(waitUs) * time.Microsecond)
			}
		}
	})
}

// TestMemoryAndRedisAgreeDelayed: TakeDelayed with waits of 0 to 1.4 s, on
// three keys shared by three limits (1.4x to 6.7x apart), answers the same on both stores, to the
// microsecond, Delay included.
func TestMemoryAndRedisAgreeDelayed(t *testing.T) {
	tw := newTwin(t)
	rng := rand.New(rand.NewPCG(1, 2))
	limits := []store.Limit{{Rate: 10, Period: time.Second, Burst: 5}, {Rate: 3, Period: time.Second, Burst: 2}, {Rate: 20, Period: time.Second, Burst: 4}}
	ctx := context.Background()
	delayed := 0
	for range 2000 {
		lim := limits[rng.IntN(len(limits))]
		key := "delayed:" + strconv.Itoa(rng.IntN(3))
		cost, maxDelay := rng.IntN(lim.Burst+1), time.Duration(rng.IntN(3))*700*time.Millisecond
		rm, errm := tw.mem.TakeDelayed(ctx, key, lim, cost, maxDelay)
		rr, errr := tw.red.TakeDelayed(ctx, key, lim, cost, maxDelay)
		if errm != nil || errr != nil || rm != rr {
			t.Fatalf("TakeDelayed(%q, %v, %d, %v): memory %+v, %v; redis %+v, %v", key, lim, cost, maxDelay, rm, errm, rr, errr)
		}
		if rm.Delay > maxDelay || (rm.Delay > 0 && !rm.Allowed) {
			t.Fatalf("TakeDelayed(%v, max %v) = %+v: a Delay past the max, or on a denial", lim, maxDelay, rm)
		}
		if rm.Delay > 0 {
			delayed++
		}
		tw.advance(time.Duration(rng.IntN(60_000)) * time.Microsecond)
	}
	if delayed < 100 {
		t.Errorf("only %d of 2000 decisions were delayed: the test does not exercise the queue", delayed)
	}
}

// TestMemoryAndRedisAgreeMixed: 20,000 random Takes, Refunds, TakeDelayeds,
// TakeAlls and Blocks on three keys under limits at the edges of what
// Validate accepts (Burst 2^50, q near 10^9, a year's period), with the
// clocks moved between them: Memory and Redis (miniredis) give the same
// Results to the µs and fail alike (4,000 under the race detector, which
// makes miniredis five times slower).
func TestMemoryAndRedisAgreeMixed(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: epoch}
	m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(0))
	defer m.Close()
	mr, mini, _ := newMiniredisClock(t)
	r := store.NewRedis(mini)
	advance := func(d time.Duration) {
		clock.Advance(d)
		mr.SetTime(clock.Now())
		mr.FastForward(d)
	}
	rnd := uint64(12345)
	next := func(n int) int {
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		return int(rnd % uint64(n))
	}
	limits := []store.Limit{
		{Rate: 7, Period: 3 * time.Second, Burst: 4},
		{Rate: 3, Period: time.Second, Burst: 10},
		{Rate: 1 << 25, Period: time.Second + time.Microsecond, Burst: 1 << 25},
		{Rate: 1, Period: time.Microsecond, Burst: 1 << 50},
		{Rate: 999_999_937, Period: time.Second, Burst: 3},
		{Rate: 2, Period: 86400 * 365 * time.Second, Burst: 2},
		{Rate: 1_000_000, Period: 1_000_003 * time.Microsecond, Burst: 1_000},
	}
	keys := []string{"a", "b", "c"}
	same := func(step int, what string, x, y store.Result, ex, ey error) {
		if (ex == nil) != (ey == nil) || x != y {
			t.Fatalf("step %d %s:\n memory %+v %v\n redis  %+v %v", step, what, x, ex, y, ey)
		}
	}
	steps := 20_000
	if race.Enabled {
		steps = 4_000
	}
	for step := range steps {
		l := limits[next(len(limits))]
		k := keys[next(len(keys))]
		cost := 0
		switch next(4) {
		case 0:
			cost = 1
		case 1:
			cost = l.Burst
		case 2:
			cost = next(min(l.Burst, 1<<30) + 1)
		}
		var what string
		var x, y store.Result
		var ex, ey error
		switch op := next(10); {
		case op < 4:
			what = fmt.Sprintf("Take(%s, %v, %d)", k, l, cost)
			x, ex = m.Take(ctx, k, l, cost)
			y, ey = r.Take(ctx, k, l, cost)
		case op < 5:
			what = fmt.Sprintf("Refund(%s, %v, %d)", k, l, cost)
			x, ex = m.Refund(ctx, k, l, cost)
			y, ey = r.Refund(ctx, k, l, cost)
		case op < 6:
			d := time.Duration(next(3000)) * time.Millisecond
			what = fmt.Sprintf("TakeDelayed(%s, %v, %d, %v)", k, l, cost, d)
			x, ex = m.TakeDelayed(ctx, k, l, cost, d)
			y, ey = r.TakeDelayed(ctx, k, l, cost, d)
		case op < 7:
			l2 := limits[next(len(limits))]
			reqs := []store.Request{{Key: k, Limit: l, Cost: cost}, {Key: k + "x", Limit: l2, Cost: min(cost, l2.Burst)}}
			what = fmt.Sprintf("TakeAll(%+v)", reqs)
			xs, ex := m.TakeAll(ctx, reqs)
			ys, ey := r.TakeAll(ctx, reqs)
			if (ex == nil) != (ey == nil) || fmt.Sprint(xs) != fmt.Sprint(ys) {
				t.Fatalf("step %d %s:\n memory %+v %v\n redis  %+v %v", step, what, xs, ex, ys, ey)
			}
			continue
		case op < 8:
			d := time.Duration(1+next(5000)) * time.Millisecond
			what = fmt.Sprintf("Block(%s, %v, %v)", k, l, d)
			ex, ey = m.Block(ctx, k, l, d), r.Block(ctx, k, l, d)
			if (ex == nil) != (ey == nil) {
				t.Fatalf("step %d %s: memory %v redis %v", step, what, ex, ey)
			}
			continue
		default:
			advance(time.Duration(next(2_000_000)) * time.Microsecond)
			continue
		}
		same(step, what, x, y, ex, ey)
	}
}
