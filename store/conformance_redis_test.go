package store_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/store"
	"github.com/tollgate-go/tollgate/storetest"
)

func TestConformanceRedisServer(t *testing.T) {
	t.Parallel()
	client := redistest.Server(t).Client(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(client) },
		Slack: 50 * time.Millisecond,
	})
}

func TestConformanceRedisCluster(t *testing.T) {
	t.Parallel()
	client := redistest.Cluster(t).Client(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(client) },
		Slack: 50 * time.Millisecond,
	})
}

func TestConformanceRedisRing(t *testing.T) {
	t.Parallel()
	a, b := redistest.Server(t), redistest.Server(t)
	if a.External {
		t.Skip("a Ring needs two servers of its own")
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { ring.Close() })
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(ring) },
		Slack: 50 * time.Millisecond,
	})
	// Both shards hold buckets: the Ring really spread the keys.
	ctx := context.Background()
	s := store.NewRedis(ring, store.WithKeyPrefix("ring:"))
	for i := range 100 {
		if _, err := s.Take(ctx, strconv.Itoa(i), store.PerMinute(1), 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, srv := range []*redistest.Instance{a, b} {
		n, err := srv.Client(t).DBSize(ctx).Result()
		if err != nil || n == 0 {
			t.Errorf("shard %s holds %d keys (%v); want some", srv.Addr, n, err)
		}
	}
}

func TestConformanceRedisSentinel(t *testing.T) {
	t.Parallel()
	client := redistest.Sentinel(t).Client(t) // redis.NewFailoverClient
	// The real-clock suite runs its sequences side by side, and a
	// FailoverClient's first connections each ask a sentinel for the
	// master: open the pool first so that the suite times decisions only.
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				client.Ping(context.Background())
			}
		}()
	}
	wg.Wait()
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(client) },
		Slack: 50 * time.Millisecond,
	})
}

// The exactness suite on the real clock, through batching (the default),
// on a real server and on a real Cluster.
func TestContentionRedisServer(t *testing.T) {
	t.Parallel()
	client := redistest.Server(t).Client(t)
	storetest.Contention(t, func(t *testing.T) store.Store { return store.NewRedis(client) }, 300*time.Millisecond)
}

func TestContentionRedisCluster(t *testing.T) {
	t.Parallel()
	client := redistest.Cluster(t).Client(t)
	storetest.Contention(t, func(t *testing.T) store.Store { return store.NewRedis(client) }, 300*time.Millisecond)
}

// Window bounds computed longer ago than a window (a call queued behind a
// stalled batch, or an app clock behind Redis's): Redis's now is past them,
// so the script cannot know its window. Every take is refused and nothing
// is written, where deciding in the last window of the bounds would count
// in a window already over and let the current one's quota through again.
func TestWindowStaleBounds(t *testing.T) {
	t.Parallel()
	client := redistest.Server(t).Client(t)
	behind := func() time.Time { return time.Now().Add(-time.Minute) }
	ctx, s := context.Background(), store.NewRedis(client, store.WithWindowClock(behind))
	for _, lim := range []store.Limit{store.FixedWindow(5, time.Second), store.SlidingWindow(5, time.Second)} {
		key := "stale:" + lim.Window.String()
		for i := range 10 {
			res, err := s.Take(ctx, key, lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed || res.RetryAfter <= 0 || res.Remaining != 0 {
				t.Fatalf("%v, take %d with bounds a minute old: %+v; want a refusal with a RetryAfter and nothing left", lim, i, res)
			}
		}
		if keys, err := client.Keys(ctx, "*"+key).Result(); err != nil || len(keys) != 0 {
			t.Fatalf("%v: keys %q written (%v); want none", lim, keys, err)
		}
		fresh := store.NewRedis(client) // its windows around now: the quota is whole
		if res, err := fresh.Take(ctx, key, lim, 5); err != nil || !res.Allowed {
			t.Fatalf("%v: a take of the whole quota with fresh bounds: %+v, %v", lim, res, err)
		}
	}
}
