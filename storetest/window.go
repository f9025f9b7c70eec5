package storetest

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// windows runs the window-quota parts: on a controlled clock, calendar
// boundaries (UTC midnight, DST changes in named zones, month ends) and the
// sliding window against its formula; on a real one, a local midnight and a
// 23-hour day of a zone made to change within seconds; on both, TakeAll of
// a bucket and a quota, refunds, and the errors.
func windows(t *testing.T, h Harness) {
	t.Run("Calendar", func(t *testing.T) {
		if h.Advance == nil || h.Now == nil {
			realMidnight(t, h)
			return
		}
		calendar(t, h)
	})
	t.Run("Sliding", func(t *testing.T) { sliding(t, h) })
	t.Run("TakeAll", func(t *testing.T) { windowTakeAll(t, h) })
	t.Run("Refund", func(t *testing.T) { windowRefund(t, h) })
	t.Run("Invalid", func(t *testing.T) { windowInvalid(t, h) })
}

// A windowStep is a Take at an instant of a controlled clock (zero: now).
type windowStep struct {
	at           time.Time
	cost         int
	allowed      bool
	remaining    int
	retry, reset time.Duration
}

func zone(t *testing.T, name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v (import _ \"time/tzdata\" in the test)", name, err)
	}
	return loc
}

func calendar(t *testing.T, h Harness) {
	berlin, york, santiago := zone(t, "Europe/Berlin"), zone(t, "America/New_York"), zone(t, "America/Santiago")
	at := func(loc *time.Location, y int, mo time.Month, d, hh, mm, ss int) time.Time {
		return time.Date(y, mo, d, hh, mm, ss, 0, loc)
	}
	day, s := 24*time.Hour, time.Second
	cases := []struct { // in the order of their instants: the clock only goes forward
		name  string
		limit store.Limit
		steps []windowStep
	}{
		{"UTC midnight", store.PerDayIn(5, nil), []windowStep{
			{at(time.UTC, 2027, 1, 30, 23, 59, 50), 1, true, 4, 0, 10 * s},
			{time.Time{}, 4, true, 0, 0, 10 * s},
			{time.Time{}, 1, false, 0, 10 * s, 10 * s},
			{at(time.UTC, 2027, 1, 30, 23, 59, 59), 1, false, 0, s, s},
			{at(time.UTC, 2027, 1, 31, 0, 0, 0), 1, true, 4, 0, day},
		}},
		{"Jan 31 to Feb 1", store.PerMonthIn(5, nil), []windowStep{
			{at(time.UTC, 2027, 1, 31, 23, 59, 59), 5, true, 0, 0, s},
			{time.Time{}, 1, false, 0, s, s},
			{at(time.UTC, 2027, 2, 1, 0, 0, 0), 2, true, 3, 0, 28 * day},
		}},
		{"Feb 28 to Mar 1", store.PerMonthIn(5, nil), []windowStep{
			{at(time.UTC, 2027, 2, 28, 12, 0, 0), 5, true, 0, 0, 12 * time.Hour},
			{at(time.UTC, 2027, 2, 28, 23, 59, 59), 1, false, 0, s, s},
			{at(time.UTC, 2027, 3, 1, 0, 0, 0), 5, true, 0, 0, 31 * day},
		}},
		{"Berlin: a day of 23 hours", store.PerDayIn(5, berlin), []windowStep{
			{at(berlin, 2027, 3, 27, 23, 0, 0), 5, true, 0, 0, time.Hour},
			{time.Time{}, 1, false, 0, time.Hour, time.Hour},
			{at(berlin, 2027, 3, 28, 0, 0, 0), 1, true, 4, 0, 23 * time.Hour},
			{at(berlin, 2027, 3, 28, 23, 59, 0), 4, true, 0, 0, time.Minute},
			{time.Time{}, 1, false, 0, time.Minute, time.Minute},
			{at(berlin, 2027, 3, 29, 0, 0, 0), 1, true, 4, 0, day},
		}},
		{"Santiago: a day without midnight", store.PerDayIn(3, santiago), []windowStep{
			// Clocks go from 24:00 on September 4 to 01:00 on the 5th.
			{at(santiago, 2027, 9, 4, 23, 30, 0), 3, true, 0, 0, 30 * time.Minute},
			{time.Time{}, 1, false, 0, 30 * time.Minute, 30 * time.Minute},
			{at(santiago, 2027, 9, 5, 1, 0, 0), 1, true, 2, 0, 23 * time.Hour},
		}},
		{"Santiago: hours across the change", store.Limit{Rate: 2, Period: time.Hour, Burst: 2, Window: store.Fixed.In(santiago)}, []windowStep{
			{at(santiago, 2027, 9, 5, 1, 10, 0), 2, true, 0, 0, 50 * time.Minute}, // the day's first hour
			{at(santiago, 2027, 9, 5, 23, 30, 0), 2, true, 0, 0, 30 * time.Minute},
			{at(santiago, 2027, 9, 5, 23, 59, 0), 1, false, 0, time.Minute, time.Minute},
			{at(santiago, 2027, 9, 6, 0, 0, 0), 1, true, 1, 0, time.Hour},
		}},
		{"Berlin: a day of 25 hours", store.PerDayIn(5, berlin), []windowStep{
			{at(berlin, 2027, 10, 31, 0, 0, 0), 5, true, 0, 0, 25 * time.Hour},
			{at(berlin, 2027, 10, 31, 23, 0, 0), 1, false, 0, time.Hour, time.Hour},
			{at(berlin, 2027, 11, 1, 0, 0, 0), 1, true, 4, 0, day},
		}},
		{"Feb 29 to Mar 1 in New York", store.PerMonthIn(5, york), []windowStep{
			{at(york, 2028, 2, 29, 23, 59, 59), 5, true, 0, 0, s},
			{time.Time{}, 1, false, 0, s, s},
			// March 2028 in New York: 31 days less the hour of DST (March 12).
			{at(york, 2028, 3, 1, 0, 0, 0), 1, true, 4, 0, 31*day - time.Hour},
		}},
		{"whole minutes from the epoch", store.FixedWindow(3, time.Minute), []windowStep{
			{at(time.UTC, 2028, 3, 2, 0, 0, 30), 3, true, 0, 0, 30 * s},
			{time.Time{}, 1, false, 0, 30 * s, 30 * s},
			{at(time.UTC, 2028, 3, 2, 0, 1, 0), 1, true, 2, 0, time.Minute},
		}},
	}
	ctx := context.Background()
	for _, c := range cases {
		st, key := h.New(t), Key(t)
		for i, step := range c.steps {
			if !step.at.IsZero() {
				d := step.at.Sub(h.Now())
				if d < 0 {
					t.Fatalf("%s step %d: the clock is past %v", c.name, i, step.at)
				}
				h.Advance(d)
			}
			r, err := st.Take(ctx, key, c.limit, step.cost)
			if err != nil || r.Allowed != step.allowed || r.Remaining != step.remaining ||
				r.RetryAfter != step.retry || r.ResetAfter != step.reset || r.Next != step.reset || r.Limit != c.limit {
				t.Errorf("%s step %d: Take(%d) at %v = %+v, %v; want allowed %v, %d left, retry %v, reset %v",
					c.name, i, step.cost, h.Now(), r, err, step.allowed, step.remaining, step.retry, step.reset)
			}
		}
	}
}

// sliding checks the sliding-window counter at 10 points of a window
// against its formula: prev*(W-elapsed)/W rounded down, plus cur, and each
// denial's RetryAfter against a search for the first instant it would fit.
// On a real clock, each answer lies between the formula's before and after
// the call.
func sliding(t *testing.T, h Harness) {
	const n, prev = 100, 80
	exact := h.Advance != nil && h.Now != nil
	w, now, wait := 10*time.Second, time.Now, func(d time.Duration) { time.Sleep(d) }
	if exact {
		now, wait = h.Now, h.Advance
	} else {
		w = 2 * time.Second
	}
	lim := store.SlidingWindow(n, w)
	st, key, ctx := h.New(t), Key(t), context.Background()
	start := now().Truncate(w).Add(w) // a window from the epoch
	wait(start.Add(w / 2).Sub(now()))
	if r, err := st.Take(ctx, key, lim, prev); err != nil || !r.Allowed || r.Remaining != n-prev {
		t.Fatalf("Take(%d) = %+v, %v", prev, r, err)
	}
	count := func(cur int, e time.Duration) int { return cur + int(int64(prev)*int64(w-e)/int64(w)) }
	// retry is the first µs at which cost fits e into the window, in it or
	// the next, by a binary search: the count only falls as time passes.
	first := func(cur int, e time.Duration, ok func(count int) bool) time.Duration {
		at := func(d time.Duration) int { // the count d after e
			if x := e + d; x < w {
				return count(cur, x)
			} else {
				return int(int64(cur) * int64(2*w-x) / int64(w))
			}
		}
		lo, hi := time.Duration(0), 2*w
		for lo < hi {
			if mid := (lo + hi) / 2 / time.Microsecond * time.Microsecond; ok(at(mid)) {
				hi = mid
			} else {
				lo = mid + time.Microsecond
			}
		}
		return lo
	}
	retry := func(cur, cost int, e time.Duration) time.Duration {
		return first(cur, e, func(c int) bool { return c+cost <= n })
	}
	// next is when the count first falls below its value e into the window.
	next := func(cur int, e time.Duration) time.Duration {
		c := count(cur, e)
		return first(cur, e, func(x int) bool { return x < c })
	}
	cur, cost := 0, 15
	for i, f := range []float64{0, 0.07, 0.19, 0.33, 0.41, 0.55, 0.625, 0.777, 0.88, 0.99} {
		e := time.Duration(f * float64(w))
		wait(start.Add(w + e).Sub(now()))
		// The instants before and after each call, into the window.
		elapsed := func() time.Duration { return now().Sub(start.Add(w)).Truncate(time.Microsecond) }
		e0 := elapsed()
		r, err := st.Take(ctx, key, lim, 0)
		e1 := elapsed()
		if e1 >= w { // a late wake-up on a loaded machine: the formulas hold within the window
			t.Logf("point %d: %v into the window of %v, past it: not checked", i, e1, w)
			break
		}
		if err != nil || r.Remaining < n-count(cur, e0) || r.Remaining > n-count(cur, e1) {
			t.Errorf("point %d (%v into the window): read = %+v, %v; want %d to %d left", i, e0, r, err, n-count(cur, e0), n-count(cur, e1))
		}
		if count(cur, e0) == count(cur, e1) && (r.Next > next(cur, e0) || r.Next < next(cur, e1)) {
			t.Errorf("point %d: read = %+v; want Next %v to %v, when the count falls", i, r, next(cur, e1), next(cur, e0))
		}
		e0 = elapsed()
		r, err = st.Take(ctx, key, lim, cost)
		e1 = elapsed()
		if err != nil {
			t.Fatal(err)
		}
		if e1 >= w {
			t.Logf("point %d: %v into the window of %v, past it: not checked", i, e1, w)
			break
		}
		if fits := count(cur, e0)+cost <= n; fits == (count(cur, e1)+cost <= n) && r.Allowed != fits {
			t.Errorf("point %d: Take(%d) with count %d = %+v; want allowed %v", i, cost, count(cur, e0), r, fits)
		}
		if r.Allowed {
			cur += cost
		} else if r.RetryAfter > retry(cur, cost, e0) || r.RetryAfter < retry(cur, cost, e1) {
			t.Errorf("point %d: denied with RetryAfter %v; want %v to %v", i, r.RetryAfter, retry(cur, cost, e1), retry(cur, cost, e0))
		}
	}
	if cur == 0 || cur == 10*cost {
		t.Errorf("%d taken at 10 points: want some allowed, some denied", cur)
	}
}

// realMidnight crosses a local midnight on the real clock, in a zone made
// so that it comes within 1.5 s and the next day has a DST change: 23 hours.
func realMidnight(t *testing.T, h Harness) {
	midnight := time.Now().Add(1500 * ms).Truncate(time.Second)
	std := -int32(midnight.Unix() % 86400) // local midnight at midnight
	loc := tzif(t, "Test/DST", std, midnight.Unix()+2*3600)
	lim := store.PerDayIn(2, loc)
	st, key, ctx := h.New(t), Key(t), context.Background()
	// take returns a Take's result and the time until end before it: the
	// store's answer lies between that and the slack less.
	take := func(end time.Time) (store.Result, time.Duration, error) {
		before := time.Until(end)
		r, err := st.Take(ctx, key, lim, 1)
		return r, before, err
	}
	near := func(got, want time.Duration) bool { return got <= want+time.Millisecond && got >= want-h.Slack }
	for i := range 2 {
		if r, want, err := take(midnight); err != nil || !r.Allowed || r.Remaining != 1-i || !near(r.ResetAfter, want) {
			t.Fatalf("Take %d before midnight = %+v, %v; want allowed, %d left, reset %v", i, r, err, 1-i, want)
		}
	}
	if r, want, err := take(midnight); err != nil || r.Allowed || !near(r.RetryAfter, want) {
		t.Fatalf("third Take = %+v, %v; want denied for %v, until midnight", r, err, want)
	}
	time.Sleep(time.Until(midnight) + 50*ms)
	if r, want, err := take(midnight.Add(23 * time.Hour)); err != nil || !r.Allowed || r.Remaining != 1 || !near(r.ResetAfter, want) {
		t.Errorf("Take after midnight = %+v, %v; want allowed, 1 left, reset in %v: a day of 23 hours", r, err, want)
	}
}

// tzif returns a zone of standard offset std (seconds east of UTC) that
// starts DST (an hour ahead) at the Unix second dst, from TZif version 1 data.
func tzif(t *testing.T, name string, std int32, dst int64) *time.Location {
	b := append([]byte("TZif"), make([]byte, 16)...)
	for _, n := range []uint32{0, 0, 0, 1, 2, 4} { // isut, isstd, leap, transitions, types, chars
		b = binary.BigEndian.AppendUint32(b, n)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(dst))
	b = append(b, 1)
	b = binary.BigEndian.AppendUint32(b, uint32(std))
	b = append(b, 0, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(std+3600))
	b = append(b, 1, 2)
	b = append(b, "S\x00D\x00"...)
	loc, err := time.LoadLocationFromTZData(name, b)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// windowTakeAll: a bucket and a quota in one TakeAll, all or nothing: a
// denial by either takes from neither. A bucket and a quota on one key are
// apart.
func windowTakeAll(t *testing.T, h Harness) {
	s := multi(t, h.New(t))
	ctx := context.Background()
	base := Key(t)
	rate, quota := store.PerSecond(10), store.FixedWindow(5, 24*time.Hour)
	reqs := []store.Request{{Key: "{" + base + "}:rate", Limit: rate, Cost: 1}, {Key: "{" + base + "}:day", Limit: quota, Cost: 1}}
	for i := range 5 {
		if res, err := s.TakeAll(ctx, reqs); err != nil || !res[0].Allowed || !res[1].Allowed || res[1].Remaining != 4-i {
			t.Fatalf("TakeAll %d = %+v, %v; want allowed, quota %d left", i, res, err, 4-i)
		}
	}
	bucket := remaining(t, s, reqs[0].Key, rate)
	res, err := s.TakeAll(ctx, reqs)
	if err != nil || res[0].Allowed || res[1].Allowed || res[1].RetryAfter <= 0 || res[0].RetryAfter != 0 {
		t.Fatalf("TakeAll past the quota = %+v, %v; want denied by the quota", res, err)
	}
	if got := remaining(t, s, reqs[0].Key, rate); got < bucket {
		t.Errorf("the bucket holds %d after the quota's denial; want %d or more: nothing taken", got, bucket)
	}
	// The bucket denies: the quota of another subject keeps its 5.
	other := []store.Request{{Key: "{" + base + ":o}:rate", Limit: rate, Cost: 10}, {Key: "{" + base + ":o}:day", Limit: quota, Cost: 1}}
	if _, err := s.Take(ctx, other[0].Key, rate, 10); err != nil {
		t.Fatal(err)
	}
	if res, err := s.TakeAll(ctx, other); err != nil || res[0].Allowed || res[1].Remaining != 5 {
		t.Errorf("TakeAll denied by the bucket = %+v, %v; want denied, the quota untouched", res, err)
	}
	if n := remaining(t, s, other[1].Key, quota); n != 5 {
		t.Errorf("quota after the bucket's denial holds %d; want 5", n)
	}
	// A bucket and a quota on one key in one TakeAll: apart, not a duplicate.
	both := []store.Request{{Key: base + ":both", Limit: rate, Cost: 1}, {Key: base + ":both", Limit: quota, Cost: 1}}
	if res, err := s.TakeAll(ctx, both); err != nil || !res[0].Allowed || res[1].Remaining != 4 {
		t.Errorf("TakeAll of a bucket and a quota on one key = %+v, %v; want allowed", res, err)
	}
	// A quota in one tag, a drained bucket in another: the quota's count
	// goes back (on a Cluster, by a second call).
	apart := []store.Request{{Key: "{" + base + ":qa}:day", Limit: quota, Cost: 2}, {Key: "{" + base + ":qb}:rate", Limit: rate, Cost: 10}}
	if _, err := s.Take(ctx, apart[1].Key, rate, 10); err != nil {
		t.Fatal(err)
	}
	if res, err := s.TakeAll(ctx, apart); err != nil || res[0].Allowed || res[0].Remaining != 5 {
		t.Errorf("TakeAll across tags denied by the bucket = %+v, %v; want denied, the quota at 5", res, err)
	}
	if n := remaining(t, s, apart[0].Key, quota); n != 5 {
		t.Errorf("quota after a denial across tags holds %d; want 5", n)
	}
	// Two unnamed zones of other offsets are other calendars: apart.
	east, west := store.PerDayIn(1, time.FixedZone("", 10*3600)), store.PerDayIn(1, time.FixedZone("", -10*3600))
	for _, lim := range []store.Limit{east, west} {
		if r, err := s.Take(ctx, base+":zones", lim, 1); err != nil || !r.Allowed {
			t.Errorf("Take under %v = %+v, %v; want allowed: a zone of its own", lim, r, err)
		}
	}
	if r, err := s.Take(ctx, base+":zones", east, 1); err != nil || r.Allowed {
		t.Errorf("second Take under %v = %+v, %v; want denied", east, r, err)
	}
	// One key, a bucket and a quota: apart.
	key := Key(t)
	for _, lim := range []store.Limit{store.PerHour(1), store.FixedWindow(1, time.Hour), store.SlidingWindow(1, time.Hour)} {
		if r, err := s.Take(ctx, key, lim, 1); err != nil || !r.Allowed {
			t.Errorf("Take under %v on a key another limit drained = %+v, %v; want allowed: apart", lim, r, err)
		}
	}
	// Two quotas of one window on a key share its count; each stays within its own.
	small, large := store.FixedWindow(3, time.Hour), store.FixedWindow(5, time.Hour)
	got := map[store.Limit]int{}
	for range 10 {
		for _, lim := range []store.Limit{small, large} {
			if r, err := s.Take(ctx, key+":two", lim, 1); err != nil {
				t.Fatal(err)
			} else if r.Allowed {
				got[lim]++
			}
		}
	}
	if got[small] > 3 || got[large] > 5 || got[small]+got[large] > 5 {
		t.Errorf("two quotas on a key let through %v; want at most 3 and 5, 5 in all", got)
	}
}

func windowRefund(t *testing.T, h Harness) {
	st := h.New(t)
	rf, ok := st.(store.Refunder)
	if !ok {
		t.Skipf("%T does not implement store.Refunder", st)
	}
	ctx, key := context.Background(), Key(t)
	lim := store.FixedWindow(5, time.Hour)
	if r, err := st.Take(ctx, key, lim, 5); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	if r, err := rf.Refund(ctx, key, lim, 2); err != nil || r.Remaining != 2 {
		t.Errorf("Refund(2) = %+v, %v; want 2 left", r, err)
	}
	if r, err := rf.Refund(ctx, key, lim, 5); err != nil || r.Remaining != 5 || r.ResetAfter != 0 {
		t.Errorf("Refund(5) = %+v, %v; want 5 left, none counted", r, err)
	}
	a, ok := st.(store.Admin)
	if !ok {
		return
	}
	// Reset: of the bucket alone, then of the quotas named too.
	sliding := store.SlidingWindow(3, time.Hour)
	for _, l := range []store.Limit{lim, sliding, store.PerHour(1)} {
		if r, err := st.Take(ctx, key, l, l.Burst); err != nil || !r.Allowed {
			t.Fatalf("Take(%d) under %v = %+v, %v", l.Burst, l, r, err)
		}
	}
	if err := a.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if n := remaining(t, st, key, lim); n != 0 {
		t.Errorf("a quota after Reset of the key alone holds %d; want 0: Reset names its quotas", n)
	}
	if err := a.Reset(ctx, key, lim, sliding, store.FixedWindow(0, time.Hour)); !errors.Is(err, store.ErrInvalidLimit) {
		t.Errorf("Reset with an invalid quota = %v; want ErrInvalidLimit", err)
	}
	if err := a.Reset(ctx, key, lim, sliding); err != nil {
		t.Fatal(err)
	}
	for _, l := range []store.Limit{lim, sliding, store.PerHour(1)} {
		if n := remaining(t, st, key, l); n != l.Burst {
			t.Errorf("%v after Reset holds %d; want %d", l, n, l.Burst)
		}
	}
}

func windowInvalid(t *testing.T, h Harness) {
	st, ctx, key := h.New(t), context.Background(), Key(t)
	berlin := zone(t, "Europe/Berlin")
	for _, lim := range []store.Limit{
		store.FixedWindow(0, time.Hour),
		{Rate: 5, Period: time.Hour, Burst: 4, Window: store.Fixed},
		{Rate: 5, Period: time.Hour, Burst: 5, Window: store.Monthly},
		{Rate: 5, Burst: 5, Window: store.Fixed},
		{Rate: 5, Period: time.Hour, Burst: 5, Window: store.Sliding.In(berlin)},
		{Rate: 5, Period: 7 * time.Hour, Burst: 5, Window: store.Fixed.In(berlin)},
		{Rate: 5, Period: time.Hour, Burst: 5, Window: &store.Window{}},
		store.SlidingWindow(1<<40, 24*time.Hour),
		store.FixedWindow(5, (1<<50+1)*time.Microsecond), // 35.7 years: a period the script cannot hold
	} {
		if _, err := st.Take(ctx, key, lim, 1); !errors.Is(err, store.ErrInvalidLimit) {
			t.Errorf("Take under %+v = %v; want ErrInvalidLimit", lim, err)
		}
	}
	lim := store.FixedWindow(5, time.Hour)
	if _, err := st.Take(ctx, key, lim, 6); !errors.Is(err, store.ErrInvalidCost) {
		t.Errorf("Take(6) of a quota of 5 = %v; want ErrInvalidCost", err)
	}
	if a, ok := st.(store.Admin); ok {
		if err := a.Block(ctx, key, lim, time.Hour); !errors.Is(err, store.ErrInvalidLimit) {
			t.Errorf("Block of a quota = %v; want ErrInvalidLimit: a block is a token bucket's", err)
		}
	}
	if d, ok := st.(store.Delayer); ok {
		if _, err := d.TakeDelayed(ctx, key, lim, 1, time.Second); !errors.Is(err, store.ErrInvalidLimit) {
			t.Errorf("TakeDelayed of a quota = %v; want ErrInvalidLimit", err)
		}
	}
}
