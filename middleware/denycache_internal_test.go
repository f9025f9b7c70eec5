package middleware

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// testClock is a settable monotonic clock.
type testClock struct{ t time.Duration }

func (c *testClock) now() time.Duration { return c.t }

func newTestDenyCache(maxKeys int) (*denyCache, *testClock) {
	d := newDenyCache(maxKeys)
	clk := &testClock{t: time.Hour}
	d.now = clk.now
	return d, clk
}

func TestDenyCacheOtherLimitIsNotRefused(t *testing.T) {
	d, clk := newTestDenyCache(100)
	key := []byte("{api:ip:192.0.2.1}")
	lim := store.PerSecond(10)
	d.denied(key, lim, 1, store.Result{Limit: lim, RetryAfter: 100 * time.Millisecond, ResetAfter: time.Second})
	clk.t += 50 * time.Millisecond
	if v, _, _ := d.check(key, store.PerMinute(10), 1); v != denyMiss {
		t.Errorf("another limit on the key: verdict %d, want a miss", v)
	}
	if v, _, _ := d.check(key, store.Limit{Rate: 10, Period: time.Second, Burst: 20}, 1); v != denyMiss {
		t.Errorf("another burst on the key: verdict %d, want a miss", v)
	}
	if v, _, _ := d.check(key, lim, 1); v != denyHit {
		t.Errorf("the limit denied: verdict %d, want a hit", v)
	}
	if v, _, _ := d.check([]byte("{api:ip:192.0.2.2}"), lim, 1); v != denyMiss {
		t.Errorf("another key: verdict %d, want a miss", v)
	}
}

func TestDenyCacheRefusal(t *testing.T) {
	// 10 tokens a second (one per 100ms), burst 10. The store denied a cost
	// of 3 with 1.5 tokens in the bucket: 150ms until 3 are there, and 850ms
	// until it is full.
	lim := store.PerSecond(10)
	key := []byte("k")
	for _, tc := range []struct {
		at            time.Duration // after the denial
		cost          int
		wantVerdict   denyVerdict
		wantRetry     time.Duration
		wantReset     time.Duration
		wantRemaining int
	}{
		{0, 3, denyHit, 150 * time.Millisecond, 850 * time.Millisecond, 1},
		{49 * time.Millisecond, 3, denyHit, 101 * time.Millisecond, 801 * time.Millisecond, 1},
		{50 * time.Millisecond, 3, denyHit, 100 * time.Millisecond, 800 * time.Millisecond, 2},
		{149 * time.Millisecond, 3, denyHit, time.Millisecond, 701 * time.Millisecond, 2}, // 2.99 tokens: 2, below the cost
		{0, 5, denyHit, 350 * time.Millisecond, 850 * time.Millisecond, 1},                // 2 more tokens: 200ms more
		{0, 2, denyMiss, 0, 0, 0}, // may pass
		{150 * time.Millisecond, 3, denyProbe, 0, 0, 0},
	} {
		d, clk := newTestDenyCache(100)
		d.denied(key, lim, 3, store.Result{Limit: lim, RetryAfter: 150 * time.Millisecond, ResetAfter: 850 * time.Millisecond, Remaining: 1})
		clk.t += tc.at
		v, res, _ := d.check(key, lim, tc.cost)
		want := store.Result{Limit: lim, RetryAfter: tc.wantRetry, ResetAfter: tc.wantReset, Remaining: tc.wantRemaining}
		if v != tc.wantVerdict || v == denyHit && res != want {
			t.Errorf("+%v, cost %d: verdict %d, %+v; want %d, %+v", tc.at, tc.cost, v, res, tc.wantVerdict, want)
		}
	}
}

// TestDenyCacheRemainingBelowCost: whatever the store's durations say
// (rounded up to the microsecond by Redis), a refusal never reports as
// many tokens as its cost.
func TestDenyCacheRemainingBelowCost(t *testing.T) {
	lim := store.Limit{Rate: 3, Period: time.Second, Burst: 10} // 333.3ms a token
	for cost := 1; cost <= 10; cost++ {
		for _, reset := range []time.Duration{0, 1, 333_333_333, 333_334 * time.Microsecond, time.Second, 3 * time.Second, 3*time.Second + 1} {
			d, clk := newTestDenyCache(10)
			d.denied([]byte("k"), lim, cost, store.Result{Limit: lim, RetryAfter: time.Microsecond, ResetAfter: reset})
			for _, at := range []time.Duration{0, 1, 999} {
				clk.t += at
				v, res, _ := d.check([]byte("k"), lim, cost)
				if v != denyHit {
					continue
				}
				if res.Remaining < 0 || res.Remaining >= cost {
					t.Errorf("cost %d, reset %v: Remaining %d, want in [0, %d]", cost, reset, res.Remaining, cost-1)
				}
			}
		}
	}
}

func TestTokensAt(t *testing.T) {
	for _, tc := range []struct {
		lim   store.Limit
		reset time.Duration
		want  int
	}{
		{store.PerSecond(10), 0, 10},
		{store.PerSecond(10), 1, 9},
		{store.PerSecond(10), 100 * time.Millisecond, 9},
		{store.PerSecond(10), 100*time.Millisecond + 1, 8},
		{store.PerSecond(10), time.Second, 0},
		{store.PerSecond(10), time.Hour, 0},
		{store.Limit{Rate: 3, Period: time.Second, Burst: 3}, 333_333_334, 1}, // 1.000000002 tokens missing
		{store.Limit{Rate: 1 << 40, Period: time.Hour, Burst: 1 << 10}, 1 << 62, 0},
	} {
		if got := tokensAt(tc.lim, tc.reset); got != tc.want {
			t.Errorf("tokensAt(%v, %v) = %d, want %d", tc.lim, tc.reset, got, tc.want)
		}
	}
}

func TestDenyCacheProbeOutcomes(t *testing.T) {
	lim := store.PerSecond(10) // a token every 100ms
	key := []byte("k")
	deny := store.Result{Limit: lim, RetryAfter: 100 * time.Millisecond, ResetAfter: time.Second}
	for _, outcome := range []string{"allowed", "denied", "failed", "recorded again meanwhile"} {
		t.Run(outcome, func(t *testing.T) {
			d, clk := newTestDenyCache(10)
			d.denied(key, lim, 1, deny)
			clk.t += 100 * time.Millisecond
			v, _, gen := d.check(key, lim, 1)
			if v != denyProbe {
				t.Fatalf("at the retry time: verdict %d, want the probe", v)
			}
			clk.t += 50 * time.Millisecond
			v, res, _ := d.check(key, lim, 1)
			if v != denyHit || res.RetryAfter != 50*time.Millisecond || res.ResetAfter != 950*time.Millisecond || res.Remaining != 0 {
				t.Fatalf("probe out, +50ms: verdict %d, %+v; want refused until the token after the probe's (50ms), full in 950ms", v, res)
			}
			switch outcome {
			case "allowed", "failed": // the limiter reports both the same way
				d.probed(key, gen)
			case "denied":
				d.denied(key, lim, 1, store.Result{Limit: lim, RetryAfter: 40 * time.Millisecond, ResetAfter: time.Second})
			case "recorded again meanwhile":
				d.denied(key, lim, 1, store.Result{Limit: lim, RetryAfter: 40 * time.Millisecond, ResetAfter: time.Second})
				d.probed(key, gen) // a late answer to the old probe: the new entry stays
			}
			v, _, _ = d.check(key, lim, 1)
			wantHit := outcome == "denied" || outcome == "recorded again meanwhile"
			if (v == denyHit) != wantHit || (!wantHit && v != denyMiss) {
				t.Errorf("after the probe: verdict %d, want hit %v", v, wantHit)
			}
			if wantHit != (d.len() == 1) {
				t.Errorf("%d entries", d.len())
			}
		})
	}
	t.Run("probe never answers", func(t *testing.T) {
		d, clk := newTestDenyCache(10)
		d.denied(key, lim, 1, deny)
		clk.t += 100 * time.Millisecond
		d.check(key, lim, 1) // the probe
		clk.t += 100*time.Millisecond - 1
		if v, _, _ := d.check(key, lim, 1); v != denyHit {
			t.Errorf("1ns before the next token: verdict %d, want a hit", v)
		}
		clk.t++
		if v, _, _ := d.check(key, lim, 1); v != denyMiss || d.len() != 0 {
			t.Errorf("at the next token: verdict %d, %d entries; want a miss and the entry dropped", v, d.len())
		}
	})
}

func TestDenyCacheBoundedShards(t *testing.T) {
	for _, maxKeys := range []int{1, 2, 15, 16, 100, 511, 512, 513, 10_000} {
		d, clk := newTestDenyCache(maxKeys)
		if got := len(d.shards) * d.shardCap; got > maxKeys || d.shardCap < 1 {
			t.Errorf("maxKeys %d: %d shards of %d", maxKeys, len(d.shards), d.shardCap)
		}
		lim := store.PerMinute(1)
		for i := range 3 * maxKeys {
			clk.t += time.Millisecond
			key := []byte{byte(i), byte(i >> 8), byte(i >> 16)}
			d.denied(key, lim, 1, store.Result{Limit: lim, RetryAfter: time.Minute, ResetAfter: time.Minute})
			if n := d.len(); n > maxKeys {
				t.Fatalf("maxKeys %d: %d entries", maxKeys, n)
			}
		}
	}
}

// The deny cache is bounded in bytes, not only in entries: 2,000 denied
// keys of 256 KiB each leave little on the heap, since it keeps a 128-bit
// hash of each key (keeping the keys grew it by 516 MB).
func TestDenyCacheBoundedInBytes(t *testing.T) {
	d := newDenyCache(10_000)
	big := strings.Repeat("x", 256<<10)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 2000 {
		d.denied([]byte(big+strconv.Itoa(i)), store.PerMinute(1), 1, store.Result{RetryAfter: time.Minute, ResetAfter: time.Minute})
	}
	if n := d.len(); n != 2000 {
		t.Fatalf("%d entries, want 2000", n)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("2,000 denied 256 KiB keys: heap grew %d KiB", grown>>10)
	if grown > 8<<20 {
		t.Errorf("heap grew %d MiB for 2,000 entries; want under 8 (keys hashed, not kept)", grown>>20)
	}
	if v, _, _ := d.check([]byte(big+"7"), store.PerMinute(1), 1); v != denyHit {
		t.Errorf("a recorded key: verdict %v, want a local refusal", v)
	}
	if v, _, _ := d.check([]byte(big+"x"), store.PerMinute(1), 1); v != denyMiss {
		t.Errorf("another key: verdict %v, want a miss", v)
	}
}
