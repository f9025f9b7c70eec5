package store_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/httprate"
	"golang.org/x/time/rate"

	"github.com/tollgate-go/tollgate/store"
)

// The benchmarks decide on one hot key and on 10,000 spread keys, with a
// limit high enough that most decisions are allowed. References in the same
// run: x/time/rate in a mutex-guarded per-key map (the usual hand-rolled
// limiter) and httprate's in-memory sliding-window counter.

var benchLimit = store.PerSecond(1_000_000)

var spreadKeys = func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "user:" + strconv.Itoa(i)
	}
	return k
}()

type decider func(key string) bool

func benchDecider(b *testing.B, d decider) {
	b.Run("hot/serial", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			d("hot")
		}
	})
	b.Run("hot/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d("hot")
			}
		})
	})
	b.Run("spread/parallel", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine from its own offset, so that they do not
			// decide on the same keys in step.
			i := int(next.Add(1)) * (len(spreadKeys) / 64)
			for pb.Next() {
				d(spreadKeys[i%len(spreadKeys)])
				i += 7
			}
		})
	})
}

func BenchmarkMemoryTake(b *testing.B) {
	m := store.NewMemory()
	defer m.Close()
	ctx := context.Background()
	benchDecider(b, func(key string) bool {
		r, _ := m.Take(ctx, key, benchLimit, 1)
		return r.Allowed
	})
}

// xrateMap is the usual per-key map of x/time/rate limiters behind a mutex.
type xrateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (x *xrateMap) allow(key string) bool {
	x.mu.Lock()
	l, ok := x.m[key]
	if !ok {
		l = rate.NewLimiter(rate.Limit(1_000_000), 1_000_000)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.Allow()
}

func BenchmarkXTimeRateMap(b *testing.B) {
	x := &xrateMap{m: map[string]*rate.Limiter{}}
	benchDecider(b, x.allow)
}

func BenchmarkHttprateLocal(b *testing.B) {
	rl := httprate.NewRateLimiter(1_000_000, time.Second, httprate.WithResponseHeaders(httprate.ResponseHeaders{}))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	benchDecider(b, func(key string) bool {
		return !rl.OnLimit(discardWriter{}, r, key)
	})
}

type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (discardWriter) WriteHeader(int)             {}
