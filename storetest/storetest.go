// Package storetest is the conformance suite that every tollgate store
// passes with the same expectations: the Memory store, and the Redis store
// on miniredis, on a real redis-server and on a real Redis Cluster. A store
// of your own (another database, a wrapper) proves that it decides as they
// do by running it from a test:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{New: newMyStore, Slack: 20 * time.Millisecond})
//		storetest.Contention(t, newMyStore, time.Second)
//	}
//
// [Run] checks the semantics table ([Sequences]) to the microsecond on a
// clock the harness controls, or within Slack on a real one, and the
// parts for [store.MultiStore] and [store.Refunder] when the store
// implements them (skipped, saying so, when it does not). [Contention]
// checks exactness on the real clock with many more goroutines than cores.
package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// Harness describes a store under test.
type Harness struct {
	// New returns a store whose buckets no other test shares.
	New func(t *testing.T) store.Store
	// Advance moves the store's clock forward by d. Nil means the store runs
	// on a real clock: the suite sleeps instead, and checks durations and
	// remaining tokens within Slack rather than to the microsecond.
	Advance func(d time.Duration)
	// Now reads the controlled clock (with Advance): the window quotas'
	// calendar cases go to given instants.
	Now func() time.Time
	// Slack is how far a duration may be from the exact value on a real
	// clock, and how late a step may start before the suite stops judging a
	// sequence (ignored when Advance is set: then results are exact).
	Slack time.Duration
}

// Step is one Take of a scripted sequence, after waiting Wait.
type Step struct {
	Wait      time.Duration
	Cost      int
	Allowed   bool
	Remaining int
	Retry     time.Duration
	Reset     time.Duration
	// ExactOnly marks a step that holds only on a controlled clock (it sits
	// within microseconds of a boundary); on a real clock the suite waits
	// and skips its Take.
	ExactOnly bool
}

// Sequence is a scripted run of Takes on one fresh key.
type Sequence struct {
	Name  string
	Limit store.Limit
	Steps []Step
}

const ms = time.Millisecond

// Sequences are the semantics table the suite runs on every store.
var Sequences = []Sequence{
	{"5/s burst 5", store.PerSecond(5), []Step{
		{Cost: 1, Allowed: true, Remaining: 4, Reset: 200 * ms},
		{Cost: 1, Allowed: true, Remaining: 3, Reset: 400 * ms},
		{Cost: 1, Allowed: true, Remaining: 2, Reset: 600 * ms},
		{Cost: 1, Allowed: true, Remaining: 1, Reset: 800 * ms},
		{Cost: 1, Allowed: true, Remaining: 0, Reset: 1000 * ms},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 200 * ms, Reset: 1000 * ms},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 200 * ms, Reset: 1000 * ms},
		{Wait: 100 * ms, Cost: 1, Allowed: false, Remaining: 0, Retry: 100 * ms, Reset: 900 * ms},
		{Wait: 100 * ms, Cost: 1, Allowed: true, Remaining: 0, Reset: 1000 * ms},
		{Wait: 500 * ms, Cost: 1, Allowed: true, Remaining: 1, Reset: 700 * ms},
		{Wait: 2 * time.Second, Cost: 0, Allowed: true, Remaining: 5, Reset: 0},
	}},
	{"100/min burst 10", store.Limit{Rate: 100, Period: time.Minute, Burst: 10}, []Step{
		{Cost: 1, Allowed: true, Remaining: 9, Reset: 600 * ms},
		{Cost: 1, Allowed: true, Remaining: 8, Reset: 1200 * ms},
		{Cost: 1, Allowed: true, Remaining: 7, Reset: 1800 * ms},
		{Cost: 1, Allowed: true, Remaining: 6, Reset: 2400 * ms},
		{Cost: 1, Allowed: true, Remaining: 5, Reset: 3000 * ms},
		{Cost: 1, Allowed: true, Remaining: 4, Reset: 3600 * ms},
		{Cost: 1, Allowed: true, Remaining: 3, Reset: 4200 * ms},
		{Cost: 1, Allowed: true, Remaining: 2, Reset: 4800 * ms},
		{Cost: 1, Allowed: true, Remaining: 1, Reset: 5400 * ms},
		{Cost: 1, Allowed: true, Remaining: 0, Reset: 6000 * ms},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 600 * ms, Reset: 6000 * ms},
		{Wait: 1500 * ms, Cost: 1, Allowed: true, Remaining: 1, Reset: 5100 * ms},
		{Cost: 1, Allowed: true, Remaining: 0, Reset: 5700 * ms},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 300 * ms, Reset: 5700 * ms},
	}},
	{"1 per 10s burst 1", store.Limit{Rate: 1, Period: 10 * time.Second, Burst: 1}, []Step{
		{Cost: 1, Allowed: true, Remaining: 0, Reset: 10 * time.Second},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 10 * time.Second, Reset: 10 * time.Second},
		{Wait: 4 * time.Second, Cost: 1, Allowed: false, Remaining: 0, Retry: 6 * time.Second, Reset: 6 * time.Second},
		{Wait: 6 * time.Second, Cost: 1, Allowed: true, Remaining: 0, Reset: 10 * time.Second},
	}},
	{"cost 3 at 10/s burst 10", store.PerSecond(10), []Step{
		{Cost: 3, Allowed: true, Remaining: 7, Reset: 300 * ms},
		{Cost: 3, Allowed: true, Remaining: 4, Reset: 600 * ms},
		{Cost: 3, Allowed: true, Remaining: 1, Reset: 900 * ms},
		{Cost: 3, Allowed: false, Remaining: 1, Retry: 200 * ms, Reset: 900 * ms},
		{Cost: 1, Allowed: true, Remaining: 0, Reset: 1000 * ms},
		{Wait: 220 * ms, Cost: 3, Allowed: false, Remaining: 2, Retry: 80 * ms, Reset: 780 * ms},
		{Cost: 0, Allowed: true, Remaining: 2, Reset: 780 * ms},
		{Wait: 180 * ms, Cost: 3, Allowed: true, Remaining: 1, Reset: 900 * ms},
		{Cost: 10, Allowed: false, Remaining: 1, Retry: 900 * ms, Reset: 900 * ms},
	}},
	{"cost 0 on a fresh key", store.PerMinute(60), []Step{
		{Cost: 0, Allowed: true, Remaining: 60, Reset: 0},
		{Cost: 60, Allowed: true, Remaining: 0, Reset: time.Minute},
		{Cost: 0, Allowed: true, Remaining: 0, Reset: time.Minute},
	}},
	{"3/s: a period the rate does not divide", store.PerSecond(3), []Step{
		{Cost: 1, Allowed: true, Remaining: 2, Reset: 333334 * time.Microsecond},
		{Cost: 1, Allowed: true, Remaining: 1, Reset: 666667 * time.Microsecond},
		{Cost: 1, Allowed: true, Remaining: 0, Reset: time.Second},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 333334 * time.Microsecond, Reset: time.Second},
		{Wait: 333333 * time.Microsecond, Cost: 1, Allowed: false, Remaining: 0, Retry: time.Microsecond, Reset: 666667 * time.Microsecond, ExactOnly: true},
		{Wait: time.Microsecond, Cost: 1, Allowed: true, Remaining: 0, Reset: time.Second, ExactOnly: true},
		{Wait: time.Second, Cost: 3, Allowed: true, Remaining: 0, Reset: time.Second},
	}},
	{"1 per day", store.Limit{Rate: 1, Period: 24 * time.Hour, Burst: 1}, []Step{
		{Cost: 1, Allowed: true, Remaining: 0, Reset: 24 * time.Hour},
		{Wait: time.Second, Cost: 1, Allowed: false, Remaining: 0, Retry: 24*time.Hour - time.Second, Reset: 24*time.Hour - time.Second},
	}},
	{"1,000,000/s", store.PerSecond(1_000_000), []Step{
		{Cost: 1_000_000, Allowed: true, Remaining: 0, Reset: time.Second},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: time.Microsecond, Reset: time.Second, ExactOnly: true},
		{Wait: 1500 * ms, Cost: 1, Allowed: true, Remaining: 999_999, Reset: time.Microsecond},
		{Cost: 999_999, Allowed: true, Remaining: 0, Reset: time.Second, ExactOnly: true},
	}},
	{"2,000,000/s: half a microsecond per token", store.Limit{Rate: 2_000_000, Period: time.Second, Burst: 4}, []Step{
		{Cost: 4, Allowed: true, Remaining: 0, Reset: 2 * time.Microsecond, ExactOnly: true},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: time.Microsecond, Reset: 2 * time.Microsecond, ExactOnly: true},
		{Wait: time.Microsecond, Cost: 2, Allowed: true, Remaining: 0, Reset: 2 * time.Microsecond, ExactOnly: true},
	}},
	{"1,000,000 per day burst 1,000,000", store.Limit{Rate: 1_000_000, Period: 24 * time.Hour, Burst: 1_000_000}, []Step{
		{Cost: 1_000_000, Allowed: true, Remaining: 0, Reset: 24 * time.Hour},
		{Cost: 1, Allowed: false, Remaining: 0, Retry: 86400 * time.Microsecond, Reset: 24 * time.Hour},
		{Wait: 864 * ms, Cost: 0, Allowed: true, Remaining: 10, Reset: 24*time.Hour - 864*ms},
	}},
}

var keySeq atomic.Int64

// Key returns a key that no other call returns in this process.
func Key(t *testing.T) string {
	return fmt.Sprintf("conformance:%d:%s", keySeq.Add(1), t.Name())
}

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	t.Run("Sequences", func(t *testing.T) {
		if h.Advance != nil { // a controlled clock is shared: one at a time
			for _, seq := range Sequences {
				t.Run(seq.Name, func(t *testing.T) { runSequence(t, h, seq) })
			}
			return
		}
		// A real clock: sleep side by side. (t.Parallel would cap the
		// number running at once at GOMAXPROCS, and these mostly sleep.)
		var wg sync.WaitGroup
		for _, seq := range Sequences {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run(seq.Name, func(t *testing.T) { runSequence(t, h, seq) })
			}()
		}
		wg.Wait()
	})
	t.Run("KeysAreIndependent", func(t *testing.T) { keysAreIndependent(t, h) })
	t.Run("InvalidCost", func(t *testing.T) { invalidCost(t, h) })
	t.Run("InvalidLimit", func(t *testing.T) { invalidLimit(t, h) })
	t.Run("TakeAll", func(t *testing.T) { takeAll(t, h, true) })
	t.Run("TakeAllAcrossTags", func(t *testing.T) { takeAll(t, h, false) })
	t.Run("TakeAllInvalid", func(t *testing.T) { takeAllInvalid(t, h) })
	t.Run("Refund", func(t *testing.T) { refund(t, h) })
	t.Run("Delayed", func(t *testing.T) { delayed(t, h) })
	t.Run("Admin", func(t *testing.T) { admin(t, h) })
	t.Run("SmallerLimit", func(t *testing.T) { smallerLimit(t, h, false) })
	t.Run("SmallerLimitTakeAll", func(t *testing.T) { smallerLimit(t, h, true) })
	t.Run("TwoLimits", func(t *testing.T) { twoLimits(t, h) })
	t.Run("HashedKeys", func(t *testing.T) { hashedKeys(t, h) })
	t.Run("Windows", func(t *testing.T) { windows(t, h) })
}

func runSequence(t *testing.T, h Harness, seq Sequence) {
	s := h.New(t)
	key := Key(t)
	exact := h.Advance != nil
	// On a real clock, step i is due at start + the waits before it, where
	// start is when the first Take returned: sleeping until a deadline keeps
	// call latencies from piling up. A step that starts late by more than
	// the slack could legitimately see another answer (a token more), so
	// the rest of the sequence is not judged, and the log says so.
	var start time.Time // zero until the first Take on a real clock
	var due, startDue, took0 time.Duration
	for i, st := range seq.Steps {
		due += st.Wait
		var late time.Duration
		switch {
		case exact:
			if st.Wait > 0 {
				h.Advance(st.Wait)
			}
		case start.IsZero():
			time.Sleep(st.Wait)
		default:
			at := start.Add(due - startDue)
			time.Sleep(time.Until(at))
			if late = time.Since(at); late > h.Slack {
				t.Logf("step %d started %v late on a busy machine: not judging the rest of %q", i, late, seq.Name)
				return
			}
		}
		if !exact && st.ExactOnly {
			continue
		}
		called := time.Now()
		got, err := s.Take(context.Background(), key, seq.Limit, st.Cost)
		if err != nil {
			t.Fatalf("step %d: Take(cost %d): %v", i, st.Cost, err)
		}
		switch {
		case exact:
		case start.IsZero():
			start, startDue, took0 = time.Now(), due, time.Since(called)
		default: // the store decided the first Take and this one anywhere within their calls
			if late += time.Since(called) + took0; late > h.Slack {
				t.Logf("step %d took until %v late on a busy machine: not judging the rest of %q", i, late, seq.Name)
				return
			}
		}
		if got.Limit != seq.Limit {
			t.Errorf("step %d: Limit = %+v, want %+v", i, got.Limit, seq.Limit)
		}
		if got.Allowed != st.Allowed {
			t.Fatalf("step %d: Allowed = %v, want %v (result %+v)", i, got.Allowed, st.Allowed, got)
		}
		if got.Remaining != st.Remaining {
			t.Errorf("step %d: Remaining = %d, want %d", i, got.Remaining, st.Remaining)
		}
		slack := time.Duration(0)
		if !exact {
			slack = h.Slack + late
		}
		checkDuration(t, i, "RetryAfter", got.RetryAfter, st.Retry, slack)
		checkDuration(t, i, "ResetAfter", got.ResetAfter, st.Reset, slack)
		if got.Allowed && got.RetryAfter != 0 {
			t.Errorf("step %d: allowed with RetryAfter %v, want 0", i, got.RetryAfter)
		}
	}
}

// shrink is how much a duration that a store reported may have shrunk
// since began: on a real clock the time passed, at least the Slack (a busy
// machine may stretch it); on a controlled one, nothing.
func (h Harness) shrink(began time.Time) time.Duration {
	if h.Advance != nil {
		return 0
	}
	return max(h.Slack, time.Since(began))
}

func checkDuration(t *testing.T, step int, name string, got, want, slack time.Duration) {
	t.Helper()
	// On a real clock time only passes: durations shrink, never grow.
	if got > want || got < want-slack {
		t.Errorf("step %d: %s = %v, want %v (slack %v)", step, name, got, want, slack)
	}
}

func keysAreIndependent(t *testing.T, h Harness) {
	s := h.New(t)
	a, b := Key(t)+":a", Key(t)+":b"
	lim := store.PerMinute(2)
	ctx := context.Background()
	for range 2 {
		if r, err := s.Take(ctx, a, lim, 1); err != nil || !r.Allowed {
			t.Fatalf("Take(a) = %+v, %v; want allowed", r, err)
		}
	}
	if r, err := s.Take(ctx, a, lim, 1); err != nil || r.Allowed {
		t.Fatalf("third Take(a) = %+v, %v; want denied", r, err)
	}
	if r, err := s.Take(ctx, b, lim, 1); err != nil || !r.Allowed || r.Remaining != 1 {
		t.Fatalf("Take(b) = %+v, %v; want allowed with 1 remaining", r, err)
	}
	long := make([]byte, 10_000)
	for i := range long {
		long[i] = 'x'
	}
	longA, longB := string(long)+"a", string(long)+"b"
	if r, err := s.Take(ctx, longA, store.PerMinute(1), 1); err != nil || !r.Allowed {
		t.Fatalf("Take(long a) = %+v, %v; want allowed", r, err)
	}
	if r, err := s.Take(ctx, longA, store.PerMinute(1), 1); err != nil || r.Allowed {
		t.Fatalf("second Take(long a) = %+v, %v; want denied", r, err)
	}
	if r, err := s.Take(ctx, longB, store.PerMinute(1), 1); err != nil || !r.Allowed {
		t.Fatalf("Take(long b) = %+v, %v; want allowed: long keys must not share a bucket", r, err)
	}
}

// hashedKeys: a key of the form a long key is stored under ("#" and 43
// characters) is a bucket of its own, and TakeAll given a long key and that
// form decides two buckets (it neither deadlocks nor charges one).
func hashedKeys(t *testing.T, h Harness) {
	s := h.New(t)
	ctx := context.Background()
	long := Key(t) + ":" + strings.Repeat("x", 200)
	lim := store.PerMinute(1)
	if r, err := s.Take(ctx, long, lim, 1); err != nil || !r.Allowed {
		t.Fatalf("Take(long) = %+v, %v; want allowed", r, err)
	}
	sum := sha256.Sum256([]byte(long))
	for _, forged := range []string{
		"#" + base64.RawURLEncoding.EncodeToString(sum[:]),
		"#" + base64.RawURLEncoding.EncodeToString(sum[:23]),
		"#" + base64.StdEncoding.EncodeToString(sum[:]),
	} {
		if r, err := s.Take(ctx, forged, lim, 1); err != nil || !r.Allowed {
			t.Errorf("Take(%q) = %+v, %v; want allowed: not the long key's bucket", forged, r, err)
		}
	}
	other := Key(t) + ":" + strings.Repeat("y", 200)
	osum := sha256.Sum256([]byte(other))
	res, err := multi(t, s).TakeAll(ctx, []store.Request{
		{Key: other, Limit: lim, Cost: 1},
		{Key: "#" + base64.RawURLEncoding.EncodeToString(osum[:23]), Limit: lim, Cost: 1},
	})
	if err != nil || !res[0].Allowed || res[0].Remaining != 0 || res[1].Remaining != 0 {
		t.Errorf("TakeAll(long key, its hashed form) = %+v, %v; want two buckets, both taken", res, err)
	}
}

func invalidCost(t *testing.T, h Harness) {
	s := h.New(t)
	key := Key(t)
	lim := store.PerSecond(5)
	for _, cost := range []int{-1, math.MinInt, 6, math.MaxInt} {
		r, err := s.Take(context.Background(), key, lim, cost)
		if !errors.Is(err, store.ErrInvalidCost) {
			t.Errorf("Take(cost %d) = %+v, %v; want ErrInvalidCost", cost, r, err)
		}
	}
	// Nothing was consumed by the refused calls.
	if r, err := s.Take(context.Background(), key, lim, 5); err != nil || !r.Allowed {
		t.Errorf("Take(cost 5) after invalid costs = %+v, %v; want allowed", r, err)
	}
}

// InvalidLimits are limits every store refuses with ErrInvalidLimit.
var InvalidLimits = []store.Limit{
	{},
	{Rate: 0, Period: time.Second, Burst: 1},
	{Rate: -1, Period: time.Second, Burst: 1},
	{Rate: 1, Period: 0, Burst: 1},
	{Rate: 1, Period: -time.Second, Burst: 1},
	{Rate: 1, Period: time.Second, Burst: 0},
	{Rate: 1, Period: time.Second, Burst: -5},
	{Rate: 1, Period: 999 * time.Nanosecond, Burst: 1},
	{Rate: 1, Period: 1500 * time.Nanosecond, Burst: 1},
	{Rate: 1 << 30, Period: time.Second, Burst: 1 << 30},
	{Rate: 1, Period: 1 << 62, Burst: 1 << 20},
}

func invalidLimit(t *testing.T, h Harness) {
	s := h.New(t)
	for _, lim := range InvalidLimits {
		r, err := s.Take(context.Background(), Key(t), lim, 1)
		if !errors.Is(err, store.ErrInvalidLimit) {
			t.Errorf("Take(%+v) = %+v, %v; want ErrInvalidLimit", lim, r, err)
		}
	}
}

func multi(t *testing.T, s store.Store) store.MultiStore {
	t.Helper()
	m, ok := s.(store.MultiStore)
	if !ok {
		t.Skipf("%T does not implement store.MultiStore: TakeAll not checked", s)
	}
	return m
}

// remaining reads a bucket without taking from it.
func remaining(t *testing.T, s store.Store, key string, lim store.Limit) int {
	t.Helper()
	r, err := s.Take(context.Background(), key, lim, 0)
	if err != nil {
		t.Fatalf("Take(%s, cost 0): %v", key, err)
	}
	return r.Remaining
}

// takeAll: a per-user limit and a global limit decided together. A request
// the global limit denies takes nothing from the user's bucket. With
// shareTag, the keys share a Cluster hash tag (one atomic call); without,
// they do not (a Cluster store decides them in two calls and gives back).
func takeAll(t *testing.T, h Harness, shareTag bool) {
	s := multi(t, h.New(t))
	ctx := context.Background()
	base := Key(t)
	user, global := "{"+base+"}:user", "{"+base+"}:global"
	if !shareTag {
		user, global = "{"+base+":u}:user", "{"+base+":g}:global"
	}
	userLim := store.Limit{Rate: 5, Period: time.Hour, Burst: 5}
	globalLim := store.Limit{Rate: 2, Period: time.Hour, Burst: 2}
	reqs := []store.Request{{Key: user, Limit: userLim, Cost: 1}, {Key: global, Limit: globalLim, Cost: 1}}
	for i := range 2 {
		res, err := s.TakeAll(ctx, reqs)
		if err != nil || len(res) != 2 || !res[0].Allowed || !res[1].Allowed {
			t.Fatalf("TakeAll %d = %+v, %v; want both allowed", i, res, err)
		}
		if res[0].Remaining != 4-i || res[1].Remaining != 1-i || res[0].Limit != userLim || res[1].Limit != globalLim {
			t.Fatalf("TakeAll %d = %+v; want remaining %d and %d with their limits", i, res, 4-i, 1-i)
		}
	}
	// The global bucket is empty: denied, and the user's bucket keeps its 3.
	res, err := s.TakeAll(ctx, reqs)
	if err != nil || len(res) != 2 || res[0].Allowed || res[1].Allowed {
		t.Fatalf("third TakeAll = %+v, %v; want denied in both Results", res, err)
	}
	if res[0].Remaining != 3 || res[0].RetryAfter != 0 {
		t.Errorf("third TakeAll, user = %+v; want remaining 3 (nothing taken), no retry of its own", res[0])
	}
	if res[1].Remaining != 0 || res[1].RetryAfter <= 0 || res[1].RetryAfter > 30*time.Minute {
		t.Errorf("third TakeAll, global = %+v; want remaining 0 and a retry within 30m", res[1])
	}
	if n := remaining(t, s, user, userLim); n != 3 {
		t.Errorf("user bucket after a denial by the global limit holds %d; want 3", n)
	}
	if n := remaining(t, s, global, globalLim); n != 0 {
		t.Errorf("global bucket holds %d; want 0", n)
	}
	// Denied by the first request this time: the second is not taken.
	other := "{" + base + "}:other"
	if !shareTag {
		other = "{" + base + ":o}:other"
	}
	res, err = s.TakeAll(ctx, []store.Request{{Key: global, Limit: globalLim, Cost: 1}, {Key: other, Limit: userLim, Cost: 2}})
	if err != nil || res[0].Allowed || res[1].Allowed || res[1].Remaining != 5 {
		t.Errorf("TakeAll denied by its first request = %+v, %v; want denied, second bucket untouched (5)", res, err)
	}
	if n := remaining(t, s, other, userLim); n != 5 {
		t.Errorf("second bucket after a denial by the first holds %d; want 5", n)
	}
	// Both denied: every violated bucket says when it would have room,
	// whether or not the store asked it (a Cluster stops at the first
	// denying tag).
	drained := "{" + base + "}:drained"
	if !shareTag {
		drained = "{" + base + ":d}:drained"
	}
	if _, err := s.Take(ctx, drained, userLim, 5); err != nil {
		t.Fatal(err)
	}
	res, err = s.TakeAll(ctx, []store.Request{{Key: global, Limit: globalLim, Cost: 1}, {Key: drained, Limit: userLim, Cost: 1}})
	if err != nil || res[0].Allowed || res[0].RetryAfter <= 0 || res[1].RetryAfter <= 0 {
		t.Errorf("TakeAll on two empty buckets = %+v, %v; want denied, a RetryAfter for each", res, err)
	} else if d := res[1].RetryAfter - 12*time.Minute; d < -time.Second || d > time.Second {
		t.Errorf("TakeAll on two empty buckets: second RetryAfter %v; want about 12m (one token of 5/h)", res[1].RetryAfter)
	}
	// One request alone behaves like Take.
	res, err = s.TakeAll(ctx, []store.Request{{Key: user, Limit: userLim, Cost: 3}})
	if err != nil || len(res) != 1 || !res[0].Allowed || res[0].Remaining != 0 {
		t.Errorf("TakeAll of one request = %+v, %v; want allowed, 0 left", res, err)
	}
}

func takeAllInvalid(t *testing.T, h Harness) {
	s := multi(t, h.New(t))
	ctx := context.Background()
	key := Key(t)
	lim := store.PerMinute(5)
	for _, tc := range []struct {
		reqs []store.Request
		want error
	}{
		{[]store.Request{{Key: key, Limit: lim, Cost: 1}, {Key: key, Limit: lim, Cost: 1}}, store.ErrDuplicateKey},
		{[]store.Request{{Key: key, Limit: lim, Cost: 1}, {Key: key + "b", Limit: lim, Cost: 6}}, store.ErrInvalidCost},
		{[]store.Request{{Key: key, Limit: lim, Cost: 1}, {Key: key + "b", Limit: lim, Cost: -1}}, store.ErrInvalidCost},
		{[]store.Request{{Key: key, Limit: lim, Cost: 1}, {Key: key + "b", Limit: store.Limit{}, Cost: 1}}, store.ErrInvalidLimit},
	} {
		res, err := s.TakeAll(ctx, tc.reqs)
		if !errors.Is(err, tc.want) {
			t.Errorf("TakeAll(%+v) = %+v, %v; want %v", tc.reqs, res, err, tc.want)
		}
	}
	if n := remaining(t, s, key, lim); n != 5 {
		t.Errorf("after refused TakeAlls the bucket holds %d; want 5 (nothing taken)", n)
	}
}

func refund(t *testing.T, h Harness) {
	st := h.New(t)
	s, ok := st.(store.Refunder)
	if !ok {
		t.Skipf("%T does not implement store.Refunder: Refund not checked", st)
	}
	ctx := context.Background()
	key := Key(t)
	lim := store.Limit{Rate: 5, Period: time.Hour, Burst: 5}
	if r, err := st.Take(ctx, key, lim, 3); err != nil || r.Remaining != 2 {
		t.Fatalf("Take(3) = %+v, %v", r, err)
	}
	if r, err := s.Refund(ctx, key, lim, 2); err != nil || !r.Allowed || r.Remaining != 4 || r.Limit != lim {
		t.Errorf("Refund(2) = %+v, %v; want allowed, 4 left", r, err)
	}
	// Never above capacity.
	if r, err := s.Refund(ctx, key, lim, 5); err != nil || r.Remaining != 5 || r.ResetAfter != 0 {
		t.Errorf("Refund(5) of a bucket missing 1 = %+v, %v; want full (5, reset 0)", r, err)
	}
	// The bucket stays full: a read and a take of all 5 see it so.
	if r, err := st.Take(ctx, key, lim, 0); err != nil || r.Remaining != 5 || r.ResetAfter != 0 {
		t.Errorf("read after refunding to full = %+v, %v; want 5 left, reset 0", r, err)
	}
	if r, err := st.Take(ctx, key, lim, 5); err != nil || !r.Allowed || r.Remaining != 0 {
		t.Errorf("Take(5) after refunding to full = %+v, %v; want allowed, 0 left", r, err)
	}
	if r, err := s.Refund(ctx, Key(t), lim, 1); err != nil || r.Remaining != 5 {
		t.Errorf("Refund on a fresh key = %+v, %v; want full", r, err)
	}
	for _, n := range []int{-1, 6} {
		if _, err := s.Refund(ctx, key, lim, n); !errors.Is(err, store.ErrInvalidCost) {
			t.Errorf("Refund(%d) = %v; want ErrInvalidCost", n, err)
		}
	}
	if _, err := s.Refund(ctx, key, store.Limit{}, 1); !errors.Is(err, store.ErrInvalidLimit) {
		t.Errorf("Refund with an invalid limit = %v; want ErrInvalidLimit", err)
	}
}

// delayed: TakeDelayed takes tokens ahead of time, each Take waiting a
// token longer than the one before, up to maxDelay; past it a Take is
// refused, consuming nothing, until it would fit; a plain Take and a read
// see the queue as debt.
func delayed(t *testing.T, h Harness) {
	st := h.New(t)
	s, ok := st.(store.Delayer)
	if !ok {
		t.Skipf("%T does not implement store.Delayer: TakeDelayed not checked", st)
	}
	ctx := context.Background()
	key := Key(t)
	lim := store.Limit{Rate: 10, Period: time.Hour, Burst: 5}
	const tok = 6 * time.Minute // a token every 6 minutes
	began := time.Now()
	near := func(got, want time.Duration) bool { return got <= want && got >= want-h.shrink(began) }
	for i := range 15 {
		r, err := s.TakeDelayed(ctx, key, lim, 1, time.Hour)
		if want := time.Duration(max(i-4, 0)) * tok; err != nil || !r.Allowed || r.Remaining != max(4-i, 0) || !near(r.Delay, want) || r.RetryAfter != 0 {
			t.Fatalf("TakeDelayed %d = %+v, %v; want allowed, %d left, Delay %v", i+1, r, err, max(4-i, 0), want)
		}
	}
	r, err := s.TakeDelayed(ctx, key, lim, 1, time.Hour)
	if err != nil || r.Allowed || !near(r.RetryAfter, tok) || r.Delay != 0 {
		t.Errorf("TakeDelayed 16, an hour and 6 minutes away = %+v, %v; want denied, RetryAfter %v", r, err, tok)
	}
	r, err = st.Take(ctx, key, lim, 1)
	if err != nil || r.Allowed || !near(r.RetryAfter, 11*tok) {
		t.Errorf("Take behind the queue = %+v, %v; want denied, RetryAfter %v", r, err, 11*tok)
	}
	if r, err = st.Take(ctx, key, lim, 0); err != nil || r.Remaining != 0 || !near(r.ResetAfter, 15*tok) {
		t.Errorf("read = %+v, %v; want 0 left, full in %v (the refusals took nothing)", r, err, 15*tok)
	}
	if _, err := s.TakeDelayed(ctx, key, lim, 1, -time.Second); !errors.Is(err, store.ErrInvalidLimit) {
		t.Errorf("TakeDelayed(maxDelay -1s) = %v; want ErrInvalidLimit", err)
	}
	// TakeAll: each request's own MaxDelay, and a Delay per bucket.
	other := Key(t)
	if r, err := st.Take(ctx, other, lim, 5); err != nil || !r.Allowed {
		t.Fatalf("Take(5) = %+v, %v", r, err)
	}
	rs, err := multi(t, st).TakeAll(ctx, []store.Request{
		{Key: other, Limit: lim, Cost: 1, MaxDelay: time.Hour}, {Key: Key(t), Limit: lim, Cost: 1, MaxDelay: time.Hour}})
	if err != nil || !rs[0].Allowed || !near(rs[0].Delay, tok) || rs[1].Delay != 0 || rs[1].Remaining != 4 {
		t.Errorf("TakeAll with MaxDelay = %+v, %v; want allowed, Delays %v and 0", rs, err, tok)
	}
}

// admin: Inspect says what a Take would answer without taking; Block makes
// a bucket refuse everything for its duration, then refill; Reset empties
// the store of a key.
func admin(t *testing.T, h Harness) {
	st := h.New(t)
	a, ok := st.(store.Admin)
	if !ok {
		t.Skipf("%T does not implement store.Admin: Reset and Block not checked", st)
	}
	ctx := context.Background()
	key := Key(t)
	lim := store.Limit{Rate: 10, Period: time.Hour, Burst: 5}
	const tok = 6 * time.Minute
	began := time.Now()
	near := func(got, want time.Duration) bool { return got <= want && got >= want-h.shrink(began)-time.Microsecond }
	if r, err := st.Take(ctx, key, lim, 3); err != nil || !r.Allowed {
		t.Fatalf("Take(3) = %+v, %v", r, err)
	}
	for _, c := range []struct {
		cost  int
		ok    bool
		retry time.Duration
	}{{2, true, 0}, {3, false, tok}, {5, false, 3 * tok}} {
		r, err := store.Inspect(ctx, st, key, lim, c.cost)
		if err != nil || r.Allowed != c.ok || r.Remaining != 2 || !near(r.RetryAfter, c.retry) {
			t.Errorf("Inspect(cost %d) = %+v, %v; want allowed %v, 2 left, RetryAfter %v", c.cost, r, err, c.ok, c.retry)
		}
	}
	if r, err := st.Take(ctx, key, lim, 0); err != nil || r.Remaining != 2 {
		t.Errorf("read after Inspect = %+v, %v; want 2 left: Inspect takes nothing", r, err)
	}
	if _, err := store.Inspect(ctx, st, key, lim, 6); !errors.Is(err, store.ErrInvalidCost) {
		t.Errorf("Inspect(cost 6) = %v; want ErrInvalidCost", err)
	}
	if err := a.Block(ctx, key, lim, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Debt 3 tokens + the bucket + an hour: a token in an hour and 3 tokens' time.
	if r, err := st.Take(ctx, key, lim, 1); err != nil || r.Allowed || !near(r.RetryAfter, time.Hour+3*tok+tok) {
		t.Errorf("Take after Block(1h) = %+v, %v; want denied for %v", r, err, time.Hour+4*tok)
	}
	if err := a.Block(ctx, key, lim, 0); !errors.Is(err, store.ErrInvalidLimit) {
		t.Errorf("Block(0) = %v; want ErrInvalidLimit", err)
	}
	// 20 years twice is more than the bucket holds (2^50 µs at this limit):
	// the second Block is an error and writes nothing.
	const years20 = 20 * 365 * 24 * time.Hour
	if err := a.Block(ctx, key, lim, years20); err != nil {
		t.Fatalf("Block(20 years) = %v", err)
	}
	if err := a.Block(ctx, key, lim, years20); !errors.Is(err, store.ErrBlockTooLong) {
		t.Errorf("a second Block(20 years) = %v; want ErrBlockTooLong", err)
	}
	if r, err := st.Take(ctx, key, lim, 1); err != nil || r.Allowed || !near(r.RetryAfter, years20+time.Hour+9*tok) { // each Block adds the bucket too
		t.Errorf("Take after the refused Block = %+v, %v; want denied for the first ones only", r, err)
	}
	if err := a.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Take(ctx, key, lim, 5); err != nil || !r.Allowed || r.Remaining != 0 {
		t.Errorf("Take(5) after Reset = %+v, %v; want allowed: the bucket is full", r, err)
	}
	if err := a.Reset(ctx, Key(t)); err != nil {
		t.Errorf("Reset of a key never used: %v", err)
	}
}

// smallerLimit: a key drained under a large limit, then decided under a
// smaller one (a limit lowered while its name stays), stays drained: state
// never moves backwards, so the smaller limit waits until the state that the
// larger one left is within its own capacity, and its denials write nothing
// that would let the larger limit through sooner.
func smallerLimit(t *testing.T, h Harness, viaTakeAll bool) {
	s := h.New(t)
	ctx := context.Background()
	key := Key(t)
	large := store.Limit{Rate: 1, Period: time.Hour, Burst: 100} // drained: full again in 100 hours
	small := store.PerSecond(10)                                 // holds 1 s of debt
	take := func(lim store.Limit, cost int) store.Result {
		t.Helper()
		if !viaTakeAll {
			r, err := s.Take(ctx, key, lim, cost)
			if err != nil {
				t.Fatalf("Take(%v, cost %d): %v", lim, cost, err)
			}
			return r
		}
		rs, err := multi(t, s).TakeAll(ctx, []store.Request{{Key: key, Limit: lim, Cost: cost}})
		if err != nil {
			t.Fatalf("TakeAll(%v, cost %d): %v", lim, cost, err)
		}
		return rs[0]
	}
	began := time.Now()
	if r := take(large, 100); !r.Allowed {
		t.Fatalf("draining the large bucket: %+v", r)
	}
	// One token of the small limit fits once the debt is down to 900 ms.
	wantRetry := 100*time.Hour - 900*ms
	for i := range 3 {
		r := take(small, 1)
		if r.Allowed || r.Remaining != 0 {
			t.Fatalf("Take %d under the smaller limit = %+v; want denied, 0 left", i, r)
		}
		checkDuration(t, i, "RetryAfter", r.RetryAfter, wantRetry, h.shrink(began))
		checkDuration(t, i, "ResetAfter", r.ResetAfter, 100*time.Hour, h.shrink(began))
	}
	if r := take(small, 0); r.Remaining != 0 || !r.Allowed {
		t.Errorf("read under the smaller limit = %+v; want allowed, 0 left", r)
	}
	// The denials wrote nothing: the large limit is as drained as before.
	if r := take(large, 1); r.Allowed || r.Remaining != 0 {
		t.Errorf("Take under the large limit after the small one's denials = %+v; want denied", r)
	} else {
		checkDuration(t, 3, "RetryAfter (large)", r.RetryAfter, time.Hour, h.shrink(began))
	}
	if h.Advance == nil {
		return
	}
	h.Advance(wantRetry - time.Microsecond)
	if r := take(small, 1); r.Allowed {
		t.Errorf("Take 1µs before RetryAfter = %+v; want denied", r)
	}
	h.Advance(time.Microsecond)
	if r := take(small, 1); !r.Allowed {
		t.Errorf("Take once RetryAfter has passed = %+v; want allowed", r)
	}
}

// twoLimits: one key decided in turn under two Limits, with costs 1 to 3,
// on a clock that does not move (or barely does): each Limit lets through
// no more than its own Burst, whatever the other did.
func twoLimits(t *testing.T, h Harness) {
	s := h.New(t)
	ctx := context.Background()
	key := Key(t)
	limits := []store.Limit{
		{Rate: 100, Period: time.Second, Burst: 50},
		{Rate: 200, Period: time.Second, Burst: 10},
		{Rate: 3, Period: time.Second, Burst: 7},
	}
	allowed := make([]int, len(limits))
	start := time.Now()
	for i := range 600 {
		j, cost := i%len(limits), 1+i%3
		r, err := s.Take(ctx, key, limits[j], cost)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			allowed[j] += cost
		}
	}
	elapsed := time.Since(start)
	if h.Advance != nil {
		elapsed = 0
	}
	for j, lim := range limits {
		if max := Allowance(lim, elapsed); float64(allowed[j]) > max {
			t.Errorf("%v let %d tokens through in %v; want at most %.1f", lim, allowed[j], elapsed, max)
		}
	}
	if allowed[0] == 0 {
		t.Errorf("%v let nothing through; want its burst, less what the others took", limits[0])
	}
}

// Allowance is the most tokens a bucket of lim can let through in elapsed
// time: Burst + Rate·elapsed/Period, plus one for the rounding of the
// stores' microsecond clocks.
func Allowance(lim store.Limit, elapsed time.Duration) float64 {
	return float64(lim.Burst) + float64(lim.Rate)*elapsed.Seconds()/lim.Period.Seconds() + 1
}
