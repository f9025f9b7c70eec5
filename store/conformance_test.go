package store_test

import (
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/store"
	"github.com/tollgate-go/tollgate/storetest"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
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
	})
}

// newMiniredis returns a miniredis whose TIME and expiry move together only
// when advance is called.
func newMiniredis(t *testing.T) (mr *miniredis.Miniredis, client *redis.Client, advance func(time.Duration)) {
	mr = miniredis.RunT(t)
	now := epoch
	mr.SetTime(now)
	client = redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	return mr, client, func(d time.Duration) {
		now = now.Add(d)
		mr.SetTime(now)
		mr.FastForward(d)
	}
}

func TestConformanceRedisMiniredis(t *testing.T) {
	_, client, advance := newMiniredis(t)
	storetest.Run(t, storetest.Harness{
		New:     func(t *testing.T) store.Store { return store.NewRedis(client) },
		Advance: advance,
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
