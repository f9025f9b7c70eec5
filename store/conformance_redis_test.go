package store_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/lua"
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

// An app clock a minute off Redis's, on a real server. Windows from the
// epoch are found on Redis's clock: the quota holds exactly, as on a store
// whose clock agrees. A calendar window's bounds come from the app's clock;
// once Redis's now is past them (a clock, or a call queued behind a stalled
// batch, a window late) the script cannot know its window: every take is
// refused and nothing written, where counting it in the last window of the
// bounds would let the current window's quota through twice.
func TestWindowClockSkew(t *testing.T) {
	t.Parallel()
	client := redistest.Server(t).Client(t)
	ctx := context.Background()
	redisNow := func() time.Time {
		now, err := client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	for _, skew := range []time.Duration{-time.Minute, time.Minute} {
		s := store.NewRedis(client, store.WithWindowClock(func() time.Time { return time.Now().Add(skew) }))
		for _, lim := range []store.Limit{store.FixedWindow(5, 10*time.Second), store.SlidingWindow(5, 10*time.Second)} {
			for attempt := 1; ; attempt++ { // again if the takes straddle a window's start
				key := fmt.Sprintf("skew:%v:%v:%d", skew, lim.Window, attempt)
				before, allowed := redisNow(), 0
				for i := range 10 {
					res, err := s.Take(ctx, key, lim, 1)
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						allowed++
					} else if i < 5 || res.RetryAfter <= 0 || res.Remaining != 0 {
						t.Fatalf("%v, app clock %v off, take %d: %+v; want 5 allowed, then refusals with a RetryAfter", lim, skew, i, res)
					}
				}
				if s0, _ := lim.WindowAt(before); !s0.Equal(first(lim.WindowAt(redisNow()))) && attempt < 5 {
					continue
				}
				if allowed != 5 {
					t.Errorf("%v, app clock %v off: %d of 10 allowed; want 5", lim, skew, allowed)
				}
				break
			}
		}
	}
	behind := store.NewRedis(client, store.WithWindowClock(func() time.Time { return time.Now().Add(-time.Minute) }))
	for _, lim := range []store.Limit{{Rate: 5, Period: time.Second, Burst: 5, Window: store.Fixed.In(time.UTC)}} {
		key := "stale:" + lim.Window.String()
		for i := range 10 {
			res, err := behind.Take(ctx, key, lim, 1)
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

func first(t, _ time.Time) time.Time { return t }

// The script's protocol (lua package doc), run raw on miniredis and a real
// server: bad arguments get an "ERR tollgate:" reply and write nothing, even
// after a valid group; and a key in several groups of one call is decided
// in order, each group seeing the writes before it, and stored once with
// the expiry of its last state.
func TestScriptProtocol(t *testing.T) {
	t.Parallel()
	_, mini, _ := newMiniredis(t)
	for _, tc := range []struct {
		name   string
		client *redis.Client
	}{{"miniredis", mini}, {"redis-server", redistest.Server(t).Client(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, c := context.Background(), tc.client
			script := redis.NewScript(lua.TokenBucket)
			run := func(keys []string, args ...any) ([]any, error) {
				v, err := script.Run(ctx, c, keys, args...).Result()
				reply, _ := v.([]any)
				return reply, err
			}
			// cap 2 tokens, q 1, t = 10 s: one token per 10 s, burst 2.
			const tok = 10_000_000
			bad := []struct {
				name string
				keys []string
				args []any
			}{
				{"not a number", []string{"p:a"}, []any{1, "x", 2 * tok, 1}},
				{"a fraction", []string{"p:a"}, []any{1, 1.5, 2 * tok, 1}},
				{"cost above cap", []string{"p:a"}, []any{1, 3 * tok, 2 * tok, 1}},
				{"cap above 2^50", []string{"p:a"}, []any{1, 1, int64(1) << 51, 1}},
				{"a group of 0", []string{"p:a"}, []any{0, 1, 2 * tok, 1}},
				{"a key without a group", []string{"p:a", "p:b"}, []any{1, tok, 2 * tok, 1}},
				{"a group past the keys", []string{"p:a"}, []any{2, tok, 2 * tok, 1, tok, 2 * tok, 1}},
				{"a valid group, then a bad one", []string{"p:a", "p:b"}, []any{1, tok, 2 * tok, 1, 1, tok, "nan", 1}},
				{"window bounds out of order", []string{"p:w"}, []any{1, 1, 5, 0, 4, 3, 2, 1}},
				{"window bounds not numbers", []string{"p:w"}, []any{1, 1, 5, 0, 1, 2, "three", 4}},
				{"a window period of 0", []string{"p:w"}, []any{1, 1, 5, -2, 0}},
				{"a window period above 2^50", []string{"p:w"}, []any{1, 1, 5, -3, int64(1)<<50 + 1}},
				{"a window period a fraction", []string{"p:w"}, []any{1, 1, 5, -2, 1.5}},
				{"a window period missing", []string{"p:w"}, []any{1, 1, 5, -2}},
				{"an unknown kind", []string{"p:w"}, []any{1, 1, 5, -4, 1000}},
			}
			for _, b := range bad {
				if _, err := run(b.keys, b.args...); err == nil || !strings.Contains(err.Error(), "ERR tollgate:") {
					t.Errorf("%s: error %v; want an \"ERR tollgate:\" reply", b.name, err)
				}
			}
			if n, err := c.Exists(ctx, "p:a", "p:b", "p:w").Result(); err != nil || n != 0 {
				t.Fatalf("after the bad calls %d keys exist (%v); want none written", n, err)
			}
			// Three groups on one key, then one of it and another key: two tokens,
			// then two denials, which write nothing of their group.
			reply, err := run([]string{"p:hot", "p:hot", "p:hot", "p:hot", "p:other"},
				1, tok, 2*tok, 1, 1, tok, 2*tok, 1, 1, tok, 2*tok, 1, 2, tok, 2*tok, 1, tok, 2*tok, 1)
			if err != nil {
				t.Fatal(err)
			}
			allowed := []any{reply[0], reply[3], reply[6], reply[9]}
			if want := []any{int64(1), int64(1), int64(0), int64(0)}; !slices.Equal(allowed, want) {
				t.Errorf("allowed per group %v; want %v (reply %v)", allowed, want, reply)
			}
			if du := []any{reply[1], reply[4], reply[7], reply[10]}; du[0].(int64) < tok-1000 || du[1].(int64) < 2*tok-1000 || du[2] != du[1] || du[3] != du[1] || reply[12] != int64(0) {
				t.Errorf("debt per group %v µs; want 10 s, 20 s, then 20 s twice, and 0 for the other key (reply %v)", du, reply)
			}
			if ttl, err := c.PTTL(ctx, "p:hot").Result(); err != nil || ttl < 19*time.Second || ttl > 20*time.Second {
				t.Errorf("PTTL of the key after the call %v (%v); want 20 s, the last state's", ttl, err)
			}
			if n, _ := c.Exists(ctx, "p:other").Result(); n != 0 {
				t.Errorf("the denied group's other key was written; want nothing of a denied group")
			}
			// A fixed window of an hour from the epoch in three groups: 2 + 2 of a
			// quota of 5, then 2 more refused; its state is written once.
			hour := time.Hour.Microseconds()
			reply, err = run([]string{"p:win", "p:win", "p:win"}, 1, 2, 5, -2, hour, 1, 2, 5, -2, hour, 1, 2, 5, -2, hour)
			if err != nil {
				t.Fatal(err)
			}
			// Per group: allowed, then now, prev, cur, start.
			if got := []any{reply[0], reply[5], reply[10], reply[3], reply[8], reply[13]}; !slices.Equal(got, []any{int64(1), int64(1), int64(0), int64(2), int64(4), int64(4)}) {
				t.Errorf("allowed and cur per group %v; want 1, 1, 0 and 2, 4, 4 (reply %v)", got, reply)
			}
			now, start := reply[1].(int64), reply[4].(int64)
			if start != now-now%hour {
				t.Errorf("window start %d for Redis's now %d; want the hour from the epoch, %d", start, now, now-now%hour)
			}
			if v, err := c.Get(ctx, "p:win").Result(); err != nil || v != fmt.Sprintf("%d:0:4", start) {
				t.Errorf("state %q (%v); want %q", v, err, fmt.Sprintf("%d:0:4", start))
			}
			if ttl, _ := c.PTTL(ctx, "p:win").Result(); ttl <= 0 || ttl > time.Hour {
				t.Errorf("PTTL of the window %v; want until the hour ends", ttl)
			}
		})
	}
}
