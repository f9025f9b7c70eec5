package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/tollgate-go/tollgate/store"
)

// Around every clock change from 1995 to 2040 of zones with odd ones
// (midnight skipped, half hours, a day skipped, two-hour changes), each
// calendar window holds its instant and ends where the next begins.
func TestWindowsAroundClockChanges(t *testing.T) {
	zones := []string{"America/Santiago", "America/Havana", "Asia/Beirut", "America/Asuncion", "Europe/Berlin",
		"America/New_York", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Tehran", "America/Sao_Paulo",
		"Africa/Cairo", "Pacific/Chatham", "Antarctica/Troll"}
	checks := 0
	for _, name := range zones {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		limits := []store.Limit{store.PerDayIn(5, loc), store.PerMonthIn(5, loc)}
		for _, p := range []time.Duration{time.Hour, 90 * time.Minute, 15 * time.Minute} {
			limits = append(limits, store.Limit{Rate: 5, Period: p, Burst: 5, Window: store.Fixed.In(loc)})
		}
		for at, stop := time.Date(1995, 1, 1, 0, 0, 0, 0, loc), time.Date(2040, 1, 1, 0, 0, 0, 0, loc); at.Before(stop); {
			_, change := at.ZoneBounds()
			if change.IsZero() {
				break
			}
			for k := -6; k <= 6; k++ {
				now := change.Add(time.Duration(k) * 20 * time.Minute)
				for _, lim := range limits {
					s, e := lim.WindowAt(now)
					_, prevEnd := lim.WindowAt(s.Add(-time.Microsecond))
					if next, _ := lim.WindowAt(e); now.Before(s) || !now.Before(e) || !prevEnd.Equal(s) || !next.Equal(e) {
						t.Fatalf("%v at %v: window [%v, %v), the one before ends %v, the next starts %v", lim, now, s, e, prevEnd, next)
					}
					checks++
				}
			}
			at = change
		}
	}
	t.Logf("%d windows checked around clock changes", checks)
}

// clockedStores returns a Memory and a Redis store on miniredis that share
// a clock, which set moves forward or back.
func clockedStores(t *testing.T, t0 time.Time) (mem *store.Memory, mr *miniredis.Miniredis, stores map[string]store.Store, set func(time.Time)) {
	clock := &fakeClock{now: t0}
	mem = store.NewMemory(store.WithClock(clock.Now), store.WithSweepInterval(0))
	t.Cleanup(func() { mem.Close() })
	mr, client, rclock := newMiniredisClock(t)
	rclock.Set(t0)
	stores = map[string]store.Store{"memory": mem, "miniredis": store.NewRedis(client, store.WithWindowClock(rclock.Now))}
	return mem, mr, stores, func(at time.Time) { clock.Set(at); rclock.Set(at); mem.Sweep() }
}

// A clock that goes back across a window's start: the later window's count
// keeps its own expiry, and a refund of an earlier take does not reach into
// a later window; a refund on a key with nothing counted writes nothing.
func TestWindowClockBack(t *testing.T) {
	t0 := time.Date(2027, 5, 3, 10, 0, 0, 0, time.UTC)
	mem, mr, stores, set := clockedStores(t, t0)
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			ctx, lim := context.Background(), store.FixedWindow(5, time.Minute)
			allowed := 0
			take := func(at time.Time) {
				set(at)
				if r, err := s.Take(ctx, name+":back", lim, 1); err != nil {
					t.Fatal(err)
				} else if r.Allowed {
					allowed++
				}
			}
			// 4 at 10:01:10, 1 at 10:00:50 (the clock back: counted in 10:01), 5 at 10:01:15.
			for range 4 {
				take(t0.Add(70 * time.Second))
			}
			take(t0.Add(50 * time.Second))
			for range 5 {
				take(t0.Add(75 * time.Second))
			}
			if allowed > 5 {
				t.Errorf("%d allowed in the window from 10:01; want at most 5", allowed)
			}
			// A refund on a key with nothing counted keeps nothing.
			if r, err := s.(store.Refunder).Refund(ctx, name+":empty", lim, 1); err != nil || r.Remaining != 5 {
				t.Errorf("Refund on a fresh key = %+v, %v", r, err)
			}
		})
	}
	if n := mem.Len(); n != 1 {
		t.Errorf("Memory holds %d buckets; want 1: a refund of nothing writes none", n)
	}
	if keys := mr.Keys(); len(keys) != 1 {
		t.Errorf("miniredis holds %v; want one key: a refund of nothing writes none", keys)
	}
}

// A state a month ahead (a clock gone back by most of a month): refused,
// not counted in a window that would expire before its own.
func TestWindowStateFarAhead(t *testing.T) {
	t0 := time.Date(2027, 3, 1, 10, 0, 0, 0, time.UTC)
	_, _, stores, set := clockedStores(t, t0)
	ctx, lim := context.Background(), store.PerMonthIn(5, nil)
	steps := []struct {
		at      time.Time
		cost    int
		allowed bool
	}{
		{t0, 3, true},
		{t0.AddDate(0, 0, -30), 2, false}, // January 30: March's state is past the bounds
		{t0.Add(time.Hour), 3, false},     // back in March: 3 of 5 counted
		{t0.Add(time.Hour), 2, true},
	}
	for _, st := range steps {
		set(st.at)
		for name, s := range stores {
			r, err := s.Take(ctx, "far", lim, st.cost)
			if err != nil || r.Allowed != st.allowed || (!r.Allowed && r.RetryAfter <= 0) {
				t.Errorf("%s: Take(%d) at %v = %+v, %v; want allowed %v (a denial with a RetryAfter)", name, st.cost, st.at, r, err, st.allowed)
			}
		}
	}
}

// A refund of a window quota from the epoch counts back only in the window its caller read:
// arriving after a boundary of Redis's clock (a slow network, a stall), it frees nothing of the
// next window (it took 1 off the next window's count: 4 served of a quota of 3).
func TestWindowRefundArrivingLate(t *testing.T) {
	mr, client, _ := newMiniredisClock(t)
	w1 := epoch.Truncate(time.Second).Add(500 * time.Millisecond)
	for _, lim := range []store.Limit{store.FixedWindow(3, time.Second), store.SlidingWindow(3, time.Second)} {
		s := store.NewRedis(client, store.WithWindowClock(func() time.Time { return w1 })) // the app, still in W1
		key := "late:" + lim.Window.String()
		mr.SetTime(w1)
		take := func(want bool) {
			t.Helper()
			if res, err := s.Take(context.Background(), key, lim, 1); err != nil || res.Allowed != want {
				t.Fatalf("%v: %+v, %v; want Allowed %v", lim, res, err, want)
			}
		}
		take(true)                          // counted in W1
		mr.SetTime(w1.Add(2 * time.Second)) // W3 on Redis, past any sliding weight of W1
		take(true)
		take(true)
		take(true)
		if _, err := s.Refund(context.Background(), key, lim, 1); err != nil {
			t.Fatal(err)
		}
		take(false)
	}
}
