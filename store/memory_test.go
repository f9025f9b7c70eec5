package store_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/store"
)

func TestMemoryNoAllocsOnKnownKey(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	ctx := context.Background()
	lim := store.PerSecond(1_000_000)
	// A long key costs no more: the store keeps only hashes of every key.
	long := strings.Repeat("x", 300)
	for _, key := range []string{"known", long, "{tag}" + long} {
		m.Take(ctx, key, lim, 1)
		allocs := testing.AllocsPerRun(1000, func() {
			m.Take(ctx, key, lim, 1)
		})
		if allocs != 0 {
			t.Errorf("Take on a known key of %d bytes: %v allocs, want 0", len(key), allocs)
		}
		buf := []byte(key)
		if allocs := testing.AllocsPerRun(1000, func() { m.TakeBytes(ctx, buf, lim, 1) }); allocs != 0 {
			t.Errorf("TakeBytes on a known key of %d bytes: %v allocs, want 0", len(key), allocs)
		}
	}
}

// TestMemoryTakeBytes: a key in bytes and as a string name one bucket.
func TestMemoryTakeBytes(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	ctx := context.Background()
	lim := store.PerMinute(10)
	for _, key := range []string{"a", "#a", strings.Repeat("k", 300)} {
		m.Take(ctx, key, lim, 3)
		if res, err := m.TakeBytes(ctx, []byte(key), lim, 2); err != nil || res.Remaining != 5 {
			t.Errorf("TakeBytes %.10q after Take: %+v, %v; want 5 left", key, res, err)
		}
		if res, _ := m.Take(ctx, key, lim, 0); res.Remaining != 5 {
			t.Errorf("Take %.10q after TakeBytes: %d left, want 5", key, res.Remaining)
		}
	}
	if _, err := m.TakeBytes(ctx, []byte("x"), lim, 11); !errors.Is(err, store.ErrInvalidCost) || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("TakeBytes cost 11 on burst 10: %v, want ErrInvalidCost naming the key", err)
	}
}

// floodHeap floods a fresh store with distinct keys and returns the live
// buckets and the heap they hold.
func floodHeap(t *testing.T, maxKeys, keys int) (live int, heap int64, m *store.Memory) {
	t.Helper()
	m = store.NewMemory(store.WithMaxKeys(maxKeys), store.WithSweepInterval(0))
	t.Cleanup(func() { m.Close() })
	ctx := context.Background()
	lim := store.PerHour(10) // buckets stay far from full for the whole test
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range keys {
		if r, err := m.Take(ctx, "flood:"+strconv.Itoa(i), lim, 1); err != nil || !r.Allowed {
			t.Fatalf("Take %d = %+v, %v", i, r, err)
		}
		if i%97 == 0 && m.Len() > maxKeys {
			t.Fatalf("after %d distinct keys: %d live, want at most %d", i+1, m.Len(), maxKeys)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	return m.Len(), int64(after.HeapAlloc) - int64(before.HeapAlloc), m
}

func TestMemoryMaxKeysUnderFlood(t *testing.T) {
	for _, n := range []int{1, 100, 10_000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			live, heap, m := floodHeap(t, n, 10*n)
			if live > n || live < n/2 {
				t.Errorf("after a flood of %d keys: %d live, want at most %d (and not far below)", 10*n, live, n)
			}
			if m.Evicted() < int64(9*n) {
				t.Errorf("Evicted() = %d, want at least %d", m.Evicted(), 9*n)
			}
			t.Logf("MaxKeys %d: %d live after %d distinct keys, heap %+d bytes", n, live, 10*n, heap)
			if n < 10_000 {
				return
			}
			// The same flood into a store with room for all of it.
			uncappedLive, uncappedHeap, _ := floodHeap(t, 10*n, 10*n)
			t.Logf("MaxKeys %d: %d live after %d distinct keys, heap %+d bytes", 10*n, uncappedLive, 10*n, uncappedHeap)
			if heap > uncappedHeap/4 {
				t.Errorf("capped store holds %d bytes, uncapped %d; want the cap to bound memory", heap, uncappedHeap)
			}
		})
	}
}

func TestMemoryDropsFullBuckets(t *testing.T) {
	clock := &fakeClock{now: epoch}
	m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(5*time.Millisecond))
	defer m.Close()
	ctx := context.Background()
	for i := range 1000 {
		m.Take(ctx, strconv.Itoa(i), store.PerSecond(10), 1)
	}
	if got := m.Len(); got != 1000 {
		t.Fatalf("Len = %d, want 1000", got)
	}
	clock.Advance(99 * time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	if got := m.Len(); got != 1000 {
		t.Fatalf("Len before the buckets are full = %d, want 1000", got)
	}
	clock.Advance(time.Millisecond) // every bucket is full again
	deadline := time.Now().Add(5 * time.Second)
	for m.Len() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := m.Len(); got != 0 {
		t.Errorf("Len after the buckets refilled = %d, want 0", got)
	}
}

func TestMemoryPeekDropsFullBucket(t *testing.T) {
	clock := &fakeClock{now: epoch}
	m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(0))
	defer m.Close()
	m.Take(context.Background(), "k", store.PerSecond(1), 1)
	clock.Advance(time.Second)
	if r, _ := m.Take(context.Background(), "k", store.PerSecond(1), 0); r.Remaining != 1 || m.Len() != 0 {
		t.Errorf("peek at a refilled bucket: %+v, Len %d; want 1 remaining and the bucket dropped", r, m.Len())
	}
}

func TestMemoryCloseStopsSweeper(t *testing.T) {
	leaktest.Check(t)
	m := store.NewMemory(store.WithSweepInterval(time.Millisecond))
	time.Sleep(5 * time.Millisecond)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Still decides after Close.
	if r, err := m.Take(context.Background(), "k", store.PerSecond(1), 1); err != nil || !r.Allowed {
		t.Errorf("Take after Close = %+v, %v", r, err)
	}
	store.NewMemory(store.WithSweepInterval(0)).Close() // no sweeper: Close returns at once
}

func TestMemoryConcurrentExact(t *testing.T) {
	clock := &fakeClock{now: epoch} // frozen: exactly Burst tokens exist
	m := store.NewMemory(store.WithClock(clock.Now))
	defer m.Close()
	lim := store.Limit{Rate: 1, Period: time.Hour, Burst: 1000}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				if r, _ := m.Take(context.Background(), "shared", lim, 1); r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := allowed.Load(); got != 1000 {
		t.Errorf("16 goroutines × 500 takes on a frozen clock: %d allowed, want exactly 1000", got)
	}
}

// TestMemoryExactWhileDropping hammers a few keys from many goroutines in
// rounds of a frozen clock. Between rounds the clock moves on until every
// bucket is full again, so the sweeper and peeks drop buckets while other
// goroutines decide on them. Every round must allow
// exactly Burst per key: a decision on a dropped bucket that was lost, or a
// bucket decided twice, shows up as a wrong count.
func TestMemoryExactWhileDropping(t *testing.T) {
	clock := &fakeClock{now: epoch}
	m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(time.Millisecond))
	defer m.Close()
	lim := store.Limit{Rate: 10, Period: 100 * time.Millisecond, Burst: 10}
	const keys, workers, rounds = 8, 8, 40
	ctx := context.Background()
	for round := range rounds {
		var allowed [keys]atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 60 {
					k := (w + i) % keys
					cost := 1
					if i%5 == 0 {
						cost = 0 // a peek, which drops a full bucket
					}
					r, err := m.Take(ctx, "k"+strconv.Itoa(k), lim, cost)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed && cost == 1 {
						allowed[k].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		for k := range keys {
			if got := allowed[k].Load(); got != 10 {
				t.Fatalf("round %d key %d: %d allowed, want exactly 10", round, k, got)
			}
		}
		clock.Advance(100 * time.Millisecond) // every bucket is full again
		if round%2 == 0 {
			time.Sleep(2 * time.Millisecond) // let the sweeper drop them
		}
	}
}

// TestMemoryChurn fills a store with buckets, lets them refill and drops
// them, over and over, so that the shards' tables fill with removed slots and
// are rebuilt, while other goroutines decide on one key throughout: its
// count must stay exact and the store must hold exactly the live buckets.
func TestMemoryChurn(t *testing.T) {
	clock := &fakeClock{now: epoch}
	m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(0))
	defer m.Close()
	ctx := context.Background()
	steady := store.Limit{Rate: 1, Period: time.Hour, Burst: 100_000}
	short := store.PerSecond(10)
	var allowed atomic.Int64
	if r, err := m.Take(ctx, "steady", steady, 1); err != nil || !r.Allowed {
		t.Fatalf("first take: %+v, %v", r, err)
	}
	allowed.Add(1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if r, err := m.Take(ctx, "steady", steady, 1); err != nil {
					t.Error(err)
					return
				} else if r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	const keys = 5000
	for round := range 8 {
		for i := range keys {
			if r, err := m.Take(ctx, "churn:"+strconv.Itoa(round)+":"+strconv.Itoa(i), short, 1); err != nil || !r.Allowed {
				t.Fatalf("round %d key %d: %+v, %v", round, i, r, err)
			}
		}
		if got := m.Len(); got != keys+1 {
			t.Fatalf("round %d: Len = %d, want %d", round, got, keys+1)
		}
		clock.Advance(time.Second) // every churn bucket is full again
		for i := range keys {
			if r, _ := m.Take(ctx, "churn:"+strconv.Itoa(round)+":"+strconv.Itoa(i), short, 0); r.Remaining != 10 {
				t.Fatalf("round %d key %d after refilling: %+v", round, i, r)
			}
		}
		if got := m.Len(); got != 1 {
			t.Fatalf("round %d after the peeks: Len = %d, want 1 (the steady key)", round, got)
		}
	}
	close(stop)
	wg.Wait()
	r, _ := m.Take(ctx, "steady", steady, 0)
	// 8 s passed on the store's clock: at 1 token an hour, nothing came back.
	if got, want := allowed.Load(), int64(100_000-r.Remaining); got != want {
		t.Errorf("steady key: %d allowed, bucket says %d taken", got, want)
	}
}

// TestMemoryExactAcrossPaths decides on one key from many goroutines on a
// frozen clock, through every way a decision reaches a bucket: Take without
// a lock, TakeAll (which holds the bucket's lock), peeks under another Limit
// (which replace the bucket), and buckets whose state never leaves the lock
// (a clock before the store's start, a limit too fine for one word). Exactly
// Burst/cost decisions must be allowed.
func TestMemoryExactAcrossPaths(t *testing.T) {
	fine := store.Limit{Rate: 7, Period: time.Second, Burst: 20000} // T = 10⁶/7 µs: fractions
	for _, tc := range []struct {
		name  string
		lim   store.Limit
		cost  int
		clock time.Duration // from the store's start
	}{
		{"lock-free", fine, 1, 0},
		{"clock before the start", fine, 1, -time.Hour},
		{"capacity near 2^50 units", store.Limit{Rate: 3, Period: 1_000_001 * time.Microsecond, Burst: 1_000_000_000}, 100_000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{now: epoch}
			m := store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(time.Millisecond))
			defer m.Close()
			clock.Advance(tc.clock)
			ctx := context.Background()
			other := store.Limit{Rate: 11, Period: time.Second, Burst: tc.lim.Burst}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for w := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 3000 {
						var ok bool
						var err error
						switch {
						case w%4 == 1:
							var rs []store.Result
							rs, err = m.TakeAll(ctx, []store.Request{
								{Key: "shared", Limit: tc.lim, Cost: tc.cost},
								{Key: "own:" + strconv.Itoa(w), Limit: tc.lim, Cost: 0},
							})
							ok = err == nil && rs[0].Allowed
						case w%4 == 2 && i%3 == 0:
							_, err = m.Take(ctx, "shared", other, 0) // a peek under another Limit
						default:
							var r store.Result
							r, err = m.Take(ctx, "shared", tc.lim, tc.cost)
							ok = r.Allowed
						}
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							allowed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			want := int64(tc.lim.Burst / tc.cost)
			if got := allowed.Load(); got != want {
				t.Errorf("%d allowed, want exactly %d", got, want)
			}
			r, err := m.Take(ctx, "shared", tc.lim, 0)
			if err != nil || r.Remaining != 0 || r.Allowed != true {
				t.Errorf("peek after the run = %+v, %v; want 0 remaining", r, err)
			}
		})
	}
}

// TestMemoryClockBefore1970 decides on a clock before the Unix epoch, where
// a full bucket's zero instant is in the future: every path must still read
// it as full.
func TestMemoryClockBefore1970(t *testing.T) {
	clock := &fakeClock{now: time.Unix(-1000, 0)}
	m := store.NewMemory(store.WithClock(clock.Now))
	defer m.Close()
	ctx := context.Background()
	lim := store.Limit{Rate: 1, Period: time.Second, Burst: 5}
	if r, err := m.Take(ctx, "k", lim, 1); err != nil || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("Take = %+v, %v; want allowed, 4 remaining", r, err)
	}
	if r, err := m.Refund(ctx, "k", lim, 1); err != nil || r.Remaining != 5 {
		t.Fatalf("Refund = %+v, %v; want 5 remaining", r, err)
	}
	if r, err := m.Take(ctx, "k", lim, 0); err != nil || r.Remaining != 5 || r.ResetAfter != 0 {
		t.Errorf("peek = %+v, %v; want 5 remaining, no reset", r, err)
	}
	rs, err := m.TakeAll(ctx, []store.Request{{Key: "k", Limit: lim, Cost: 0}})
	if err != nil || rs[0].Remaining != 5 || rs[0].ResetAfter != 0 {
		t.Errorf("TakeAll peek = %+v, %v; want 5 remaining, no reset", rs, err)
	}
	for i := range 5 {
		if r, err := m.Take(ctx, "k", lim, 1); err != nil || !r.Allowed || r.Remaining != 4-i {
			t.Fatalf("take %d = %+v, %v", i, r, err)
		}
	}
	if r, _ := m.Take(ctx, "k", lim, 1); r.Allowed {
		t.Errorf("sixth take = %+v; want denied", r)
	}
}

// Unusable options are reported by Validate, never silently replaced; the
// store still works, as if they had not been given.
func TestStoreOptionErrors(t *testing.T) {
	for name, s := range map[string]interface {
		store.Store
		Validate() error
	}{
		"WithMaxKeys(0)":   store.NewMemory(store.WithMaxKeys(0)),
		"WithMaxKeys(-5)":  store.NewMemory(store.WithMaxKeys(-5)),
		"WithClock(nil)":   store.NewMemory(store.WithClock(nil)),
		"WithBatching(-1)": store.NewRedis(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), store.WithBatching(-1)),
	} {
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), strings.SplitN(name, "(", 2)[0]) {
			t.Errorf("%s: Validate() = %v, want an error naming the option", name, err)
		}
		if m, ok := s.(*store.Memory); ok {
			if r, err := m.Take(context.Background(), "k", store.PerSecond(1), 1); err != nil || !r.Allowed {
				t.Errorf("%s: Take = %+v, %v; want a working store", name, r, err)
			}
			m.Close()
		}
	}
	m := store.NewMemory(store.WithMaxKeys(1), store.WithClock(time.Now))
	defer m.Close()
	if err := m.Validate(); err != nil {
		t.Errorf("good options: Validate() = %v", err)
	}
}
