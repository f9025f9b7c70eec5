package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/internal/race"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// steppingClock returns a clock for store.WithClock that moves one second
// forward at each reading, so that every decision of a test finds its
// bucket in the same state and writes the same headers.
func steppingClock() func() time.Time {
	t := time.Unix(1_700_000_000, 0)
	return func() time.Time {
		t = t.Add(time.Second)
		return t
	}
}

// TestAllowedPathAllocatesNothing pins the cost of the common case: an
// allowed request on the Memory store allocates nothing in the limiter,
// with the default headers and the default key (the response writer's
// header map is reused, as benchWriter does, so what remains would be ours).
func TestAllowedPathAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	m := store.NewMemory(store.WithClock(steppingClock()), store.WithSweepInterval(0))
	for _, tc := range []struct {
		name       string
		remoteAddr string
		opts       []middleware.Option
		wantRL     string
		allocs     float64
	}{
		{"default", "192.0.2.1:1234", nil, `"default";r=99;t=1`, 0},
		// Given, PeerIP is a KeyFunc like any other: its subject is a string.
		{"PeerIP given", "192.0.2.1:1234", []middleware.Option{middleware.WithKeyFunc(keyfuncs.PeerIP)}, `"PeerIP given";r=99;t=1`, 1},
		{"IPv6 peer", "[2001:db8::1]:443", nil, `"IPv6 peer";r=99;t=1`, 0},
		{"no headers", "192.0.2.1:1234", []middleware.Option{middleware.WithHeaders(0)}, "", 0},
		{"all delta headers", "192.0.2.1:1234", []middleware.Option{middleware.WithHeaders(headers.Default | headers.XRateLimitDelta)}, `"all delta headers";r=99;t=1`, 0},
		{"deny cache", "192.0.2.1:1234", []middleware.Option{middleware.WithDenyCache(1000)}, `"deny cache";r=99;t=1`, 0},
		{"static key", "192.0.2.1:1234", []middleware.Option{middleware.WithKeyFunc(mustKey(keyfuncs.Static("global")))}, `"static key";r=99;t=1`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := mustNew(t, m, store.PerSecond(100), append(tc.opts, middleware.WithName(tc.name))...)
			h := l.Handler(noop)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remoteAddr
			w := &benchWriter{h: http.Header{}}
			serve := func() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
			serve() // creates the bucket and formats the header values
			if got := w.h.Get("RateLimit"); got != tc.wantRL {
				t.Fatalf("RateLimit %q, want %q", got, tc.wantRL)
			}
			if n := testing.AllocsPerRun(1000, serve); n != tc.allocs {
				t.Errorf("%v allocations per allowed request, want %v", n, tc.allocs)
			}
			if got := w.h.Get("RateLimit"); got != tc.wantRL {
				t.Errorf("after the runs: RateLimit %q, want %q", got, tc.wantRL)
			}
		})
	}
}

// TestMemoryKeepsNoKey checks what the limiter relies on to hand the Memory
// store a key in a buffer it reuses (see Limiter.take): TakeBytes keeps no
// reference to the bytes of its key, whether it creates or updates a
// bucket, evicts another to make room, or fails.
func TestMemoryKeepsNoKey(t *testing.T) {
	ctx := context.Background()
	lim := store.PerMinute(10)
	t.Run("create, update, fail", func(t *testing.T) {
		m := store.NewMemory(store.WithSweepInterval(0))
		long := "{t:" + strings.Repeat("x", 200) + "}" // hashed by the store
		for _, key := range []string{"{t:ip:192.0.2.1}", long} {
			buf := []byte(key)
			for range 3 {
				if _, err := m.TakeBytes(ctx, buf, lim, 1); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := m.TakeBytes(ctx, buf, lim, 11); err == nil || !strings.Contains(err.Error(), key[:10]) {
				t.Fatalf("cost 11 on a burst of 10: %v, want an error naming the key", err)
			}
			for i := range buf { // the buffer is reused for another key
				buf[i] = 'z'
			}
			if res, _ := m.Take(ctx, key, lim, 0); res.Remaining != 7 {
				t.Errorf("key %.20q after its buffer changed: %d tokens, want 7", key, res.Remaining)
			}
			if res, _ := m.Take(ctx, string(buf), lim, 0); res.Remaining != 10 {
				t.Errorf("the buffer's new bytes name a bucket with %d tokens, want a new, full one", res.Remaining)
			}
		}
	})
	t.Run("evict", func(t *testing.T) {
		m := store.NewMemory(store.WithSweepInterval(0), store.WithMaxKeys(64))
		buf := make([]byte, 0, 32)
		var keys []string
		for i := range 300 {
			buf = strconv.AppendInt(append(buf[:0], "{t:"...), int64(i), 10)
			buf = append(buf, '}')
			keys = append(keys, string(buf))
			if _, err := m.TakeBytes(ctx, buf, lim, 1); err != nil {
				t.Fatal(err)
			}
		}
		if m.Evicted() == 0 {
			t.Fatal("no bucket evicted: the test does not test eviction")
		}
		found := 0
		for _, key := range keys {
			if res, _ := m.Take(ctx, key, lim, 0); res.Remaining == 9 {
				found++
			}
		}
		if found != m.Len() || found == 0 {
			t.Errorf("%d of %d live buckets found under their keys; want all", found, m.Len())
		}
	})
}
