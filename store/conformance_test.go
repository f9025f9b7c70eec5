package store_test

import (
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the zones of the window quotas' cases, on any machine

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/store"
	"github.com/tollgate-go/tollgate/storetest"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	moved func(now time.Time, d time.Duration) // if set, called as the clock moves
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the clock to at, forward or back.
func (c *fakeClock) Set(at time.Time) {
	c.mu.Lock()
	d := at.Sub(c.now)
	c.now = at
	if c.moved != nil {
		c.moved(c.now, d)
	}
	c.mu.Unlock()
}

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestConformanceMemory(t *testing.T) {
	clock := &fakeClock{now: epoch}
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) store.Store {
			m := store.NewMemory(store.WithClock(clock.Now))
			t.Cleanup(func() { m.Close() })
			return m
		},
		Advance: clock.Advance,
		Now:     clock.Now,
	})
}

// newMiniredis returns a miniredis whose TIME and expiry move together only
// when advance is called.
func newMiniredis(t *testing.T) (mr *miniredis.Miniredis, client *redis.Client, advance func(time.Duration)) {
	mr, client, clock := newMiniredisClock(t)
	return mr, client, clock.Advance
}

// newMiniredisClock is newMiniredis, with the clock it moves.
func newMiniredisClock(t *testing.T) (*miniredis.Miniredis, *redis.Client, *fakeClock) {
	mr := miniredis.RunT(t)
	mr.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	return mr, client, &fakeClock{now: epoch, moved: func(now time.Time, d time.Duration) {
		mr.SetTime(now)
		if d > 0 { // expiry only moves forward
			mr.FastForward(d)
		}
	}}
}

func TestConformanceRedisMiniredis(t *testing.T) {
	_, client, clock := newMiniredisClock(t)
	storetest.Run(t, storetest.Harness{
		New:     func(t *testing.T) store.Store { return store.NewRedis(client, store.WithWindowClock(clock.Now)) },
		Advance: clock.Advance,
		Now:     clock.Now,
	})
}

func TestContentionMemory(t *testing.T) {
	storetest.Contention(t, func(t *testing.T) store.Store {
		m := store.NewMemory()
		t.Cleanup(func() { m.Close() })
		return m
	}, 300*time.Millisecond)
}

// Both stores implement every part of the conformance suite, which skips
// the parts of a store that does not.
var (
	_ store.MultiStore = (*store.Memory)(nil)
	_ store.Refunder   = (*store.Memory)(nil)
	_ store.MultiStore = (*store.Redis)(nil)
	_ store.Refunder   = (*store.Redis)(nil)
)

var (
	_ store.Admin = (*store.Memory)(nil)
	_ store.Admin = (*store.Redis)(nil)
)
