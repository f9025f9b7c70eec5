package storetest

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// Goroutines are the numbers of goroutines the contention suite runs with:
// on a 2-core machine, many more than GOMAXPROCS, so that goroutines are
// preempted between reading the clock and deciding.
var Goroutines = []int{2, 16, 64, 256}

// Contention runs the exactness suite on the real clock: many goroutines
// hammer one key, or 1,000, for d, through Take with costs 1 to 3, Take with
// Refund interleaved, TakeAll (per user and global), one key under two
// Limits in turn, and window quotas, and no bucket may let through more than
// [Allowance](limit, elapsed) tokens, net of refunds. newStore returns a
// store on the real clock whose buckets no other test shares.
func Contention(t *testing.T, newStore func(t *testing.T) store.Store, d time.Duration) {
	for _, g := range Goroutines {
		t.Run(fmt.Sprintf("g%d", g), func(t *testing.T) {
			t.Run("OneKey", func(t *testing.T) { oneKey(t, newStore(t), g, d, false) })
			t.Run("Refund", func(t *testing.T) { oneKey(t, newStore(t), g, d, true) })
			t.Run("TwoLimits", func(t *testing.T) { twoLimitsRace(t, newStore(t), g, d) })
			t.Run("Delayed", func(t *testing.T) { delayedRace(t, newStore(t), g, d) })
			t.Run("ManyKeys", func(t *testing.T) { manyKeys(t, newStore(t), g, d) })
			t.Run("TakeAll", func(t *testing.T) { takeAllRace(t, newStore(t), g, d) })
			t.Run("Windows", func(t *testing.T) { windowsRace(t, newStore(t), g, d) })
		})
	}
}

// hammer runs g goroutines calling f until d has passed and returns the
// time from before the first call to after the last return.
func hammer(g int, d time.Duration, f func(r *rand.Rand) error) (time.Duration, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	start := time.Now()
	stop := start.Add(d)
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for time.Now().Before(stop) {
				if err := f(r); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), first
}

// check judges one bucket and returns its tokens as a share of the ideal
// Burst + Rate·elapsed.
func check(t *testing.T, what string, lim store.Limit, tokens int64, elapsed time.Duration) float64 {
	t.Helper()
	max := Allowance(lim, elapsed)
	if float64(tokens) > max {
		t.Errorf("%s: %v let %d tokens through in %v; want at most %.1f", what, lim, tokens, elapsed, max)
	}
	return float64(tokens) / (max - 1)
}

// report logs the share of the ideal that the worst bucket of a case let
// through (go test -v prints it: the figures of the exactness table).
func report(t *testing.T, shares ...float64) {
	t.Helper()
	t.Logf("exactness: worst bucket at %.3f× Burst + Rate·T", slices.Max(shares))
}

// oneKey: one key at 100/s burst 50, costs 1 to 3; with refund, half of the
// allowed Takes give their tokens back, and the net count is judged.
func oneKey(t *testing.T, s store.Store, g int, d time.Duration, refund bool) {
	ctx := context.Background()
	key := Key(t)
	lim := store.Limit{Rate: 100, Period: time.Second, Burst: 50}
	rf, _ := s.(store.Refunder)
	if refund && rf == nil {
		t.Skipf("%T does not give tokens back", s)
	}
	var net, allowed atomic.Int64
	elapsed, err := hammer(g, d, func(r *rand.Rand) error {
		cost := 1 + r.IntN(3)
		res, err := s.Take(ctx, key, lim, cost)
		if err != nil || !res.Allowed {
			return err
		}
		allowed.Add(int64(cost))
		net.Add(int64(cost))
		if refund && r.IntN(2) == 0 {
			if _, err := rf.Refund(ctx, key, lim, cost); err != nil {
				return err
			}
			net.Add(-int64(cost))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	report(t, check(t, "net of refunds", lim, net.Load(), elapsed))
	if allowed.Load() < int64(lim.Burst)/2 {
		t.Errorf("only %d tokens were taken in %v; want at least %d", allowed.Load(), elapsed, lim.Burst/2)
	}
}

// twoLimitsRace: one key, each goroutine deciding under one of two Limits in
// turn; each Limit's own count is judged.
func twoLimitsRace(t *testing.T, s store.Store, g int, d time.Duration) {
	take := func(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
		return s.Take(ctx, key, lim, cost)
	}
	raceTwoLimits(t, take, 0, g, d)
}

// delayedRace: twoLimitsRace through TakeDelayed with a maxDelay of 200 ms:
// each limit takes at most its allowance over the run and the 200 ms its
// tokens may be taken ahead.
func delayedRace(t *testing.T, st store.Store, g int, d time.Duration) {
	s, ok := st.(store.Delayer)
	if !ok {
		t.Skipf("%T does not implement store.Delayer", st)
	}
	const ahead = 200 * time.Millisecond
	take := func(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
		return s.TakeDelayed(ctx, key, lim, cost, ahead)
	}
	raceTwoLimits(t, take, ahead, g, d)
}

// raceTwoLimits hammers one key through take under two Limits in turn and
// judges each Limit's count over the run and ahead.
func raceTwoLimits(t *testing.T, take func(context.Context, string, store.Limit, int) (store.Result, error), ahead time.Duration, g int, d time.Duration) {
	ctx := context.Background()
	key := Key(t)
	limits := [2]store.Limit{{Rate: 100, Period: time.Second, Burst: 50}, {Rate: 200, Period: time.Second, Burst: 10}}
	var counts [2]atomic.Int64
	elapsed, err := hammer(g, d, func(r *rand.Rand) error {
		j, cost := r.IntN(2), 1+r.IntN(3)
		res, err := take(ctx, key, limits[j], cost)
		if err == nil && res.Allowed {
			counts[j].Add(int64(cost))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	report(t, check(t, "limit 1 of 2", limits[0], counts[0].Load(), elapsed+ahead),
		check(t, "limit 2 of 2", limits[1], counts[1].Load(), elapsed+ahead))
}

// manyKeys: 1,000 keys at 10/s burst 5, every one judged.
func manyKeys(t *testing.T, s store.Store, g int, d time.Duration) {
	ctx := context.Background()
	base := Key(t)
	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 5}
	const n = 1000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s:%d", base, i)
	}
	var counts [n]atomic.Int64
	elapsed, err := hammer(g, d, func(r *rand.Rand) error {
		i, cost := r.IntN(n), 1+r.IntN(3)
		res, err := s.Take(ctx, keys[i], lim, cost)
		if err == nil && res.Allowed {
			counts[i].Add(int64(cost))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	shares := make([]float64, n)
	for i := range keys {
		shares[i] = check(t, keys[i], lim, counts[i].Load(), elapsed)
	}
	report(t, shares...)
}

// takeAllRace: 1,000 users, each request taking from its user's bucket and
// a global one together; the global bucket and every user's are judged.
func takeAllRace(t *testing.T, st store.Store, g int, d time.Duration) {
	s, ok := st.(store.MultiStore)
	if !ok {
		t.Skipf("%T does not implement TakeAll", st)
	}
	ctx := context.Background()
	base := Key(t)
	userLim := store.Limit{Rate: 10, Period: time.Second, Burst: 5}
	globalLim := store.Limit{Rate: 200, Period: time.Second, Burst: 50}
	const n = 1000
	users := make([]string, n)
	for i := range users {
		users[i] = fmt.Sprintf("{%s:%d}:user", base, i)
	}
	var counts [n]atomic.Int64
	var global atomic.Int64
	elapsed, err := hammer(g, d, func(r *rand.Rand) error {
		i, cost := r.IntN(n), 1+r.IntN(3)
		res, err := s.TakeAll(ctx, []store.Request{
			{Key: users[i], Limit: userLim, Cost: cost},
			{Key: "{" + base + "}:global", Limit: globalLim, Cost: cost},
		})
		if err == nil && res[0].Allowed {
			counts[i].Add(int64(cost))
			global.Add(int64(cost))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	shares := []float64{check(t, "global", globalLim, global.Load(), elapsed)}
	for i := range counts {
		shares = append(shares, check(t, users[i], userLim, counts[i].Load(), elapsed))
	}
	report(t, shares...)
}

// windowsRace: one key under two fixed quotas of one window (which share
// its count), a sliding one, and a bucket and a fixed quota in one TakeAll,
// in turn, costs 1 to 3: no quota lets through more than its count in
// each window the run touched.
func windowsRace(t *testing.T, st store.Store, g int, d time.Duration) {
	ctx, key := context.Background(), Key(t)
	w := 100 * time.Millisecond
	small, large, sliding := store.FixedWindow(30, w), store.FixedWindow(50, w), store.SlidingWindow(40, w)
	quota, bucket := store.FixedWindow(20, w), store.Limit{Rate: 100, Period: time.Second, Burst: 10}
	ms, _ := st.(store.MultiStore)
	var counts [5]atomic.Int64 // small, large, sliding, quota and bucket
	start := time.Now()
	elapsed, err := hammer(g, d, func(r *rand.Rand) error {
		cost, i := 1+r.IntN(3), r.IntN(4)
		if i == 3 {
			if ms == nil {
				return nil
			}
			res, err := ms.TakeAll(ctx, []store.Request{{Key: "{" + key + "}:q", Limit: quota, Cost: cost}, {Key: "{" + key + "}:b", Limit: bucket, Cost: cost}})
			if err == nil && res[0].Allowed {
				counts[3].Add(int64(cost))
				counts[4].Add(int64(cost))
			}
			return err
		}
		res, err := st.Take(ctx, key, []store.Limit{small, large, sliding}[i], cost)
		if err == nil && res.Allowed {
			counts[i].Add(int64(cost))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	windows := int64(start.Add(elapsed).UnixMicro()/w.Microseconds() - start.UnixMicro()/w.Microseconds() + 1)
	var shares []string
	for _, c := range []struct {
		name string
		got  int64
		max  int
	}{
		{"the smaller fixed quota", counts[0].Load(), small.Rate},
		{"both fixed quotas of the key", counts[0].Load() + counts[1].Load(), large.Rate},
		{"the sliding quota", counts[2].Load(), sliding.Rate},
		{"the quota of a TakeAll", counts[3].Load(), quota.Rate},
	} {
		if c.got > int64(c.max)*windows {
			t.Errorf("%s let %d through in %d windows; want at most %d each", c.name, c.got, windows, c.max)
		}
		shares = append(shares, fmt.Sprintf("%s %.3f×", c.name, float64(c.got)/float64(int64(c.max)*windows)))
	}
	t.Logf("exactness: of their counts per window, %v", shares)
	check(t, "the bucket of a TakeAll", bucket, counts[4].Load(), elapsed)
	if counts[0].Load()+counts[2].Load() == 0 {
		t.Errorf("nothing let through in %v", elapsed)
	}
}
