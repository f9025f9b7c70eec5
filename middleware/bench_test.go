package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/go-chi/httprate"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// benchWriter is a ResponseWriter that keeps nothing, with a header map
// cleared per request, so that the benchmarks measure the middleware rather
// than a recorder.
type benchWriter struct{ h http.Header }

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *benchWriter) WriteHeader(int)             {}

var noop = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// serveBench serves requests from 1,000 client addresses (or one, when hot)
// through h, serially and in parallel.
func serveBench(b *testing.B, h http.Handler) {
	reqs := make([]*http.Request, 1000)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/items", nil)
		reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":4242"
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		w := &benchWriter{h: http.Header{}}
		for i := range b.N {
			clear(w.h)
			h.ServeHTTP(w, reqs[i%len(reqs)])
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			w := &benchWriter{h: http.Header{}}
			i := 0
			for pb.Next() {
				clear(w.h)
				h.ServeHTTP(w, reqs[i%len(reqs)])
				i += 7
			}
		})
	})
}

// The limit is high enough that every request is allowed: the benchmarks
// measure the cost of an allowed request, the common case.
const benchRate = 1_000_000_000

func BenchmarkBare(b *testing.B) { serveBench(b, noop) }

func BenchmarkTollgateMemory(b *testing.B) {
	m := store.NewMemory()
	defer m.Close()
	lim, err := middleware.New(m, store.PerSecond(10_000_000)) // the default key: the peer, built in place
	if err != nil {
		b.Fatal(err)
	}
	serveBench(b, lim.Handler(noop))
}

func BenchmarkTollgateMemoryNoHeaders(b *testing.B) {
	m := store.NewMemory()
	defer m.Close()
	lim, err := middleware.New(m, store.PerSecond(10_000_000), middleware.WithHeaders(0))
	if err != nil {
		b.Fatal(err)
	}
	serveBench(b, lim.Handler(noop))
}

// BenchmarkTollgateRedis is an allowed request on a real redis-server:
// its allocations per request are the Redis path's, go-redis's included.
func BenchmarkTollgateRedis(b *testing.B) {
	srv := redistest.Server(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	b.Cleanup(func() { client.Close() })
	lim, err := middleware.New(store.NewRedis(client, store.WithKeyPrefix(b.Name()+":")), store.PerSecond(10_000_000))
	if err != nil {
		b.Fatal(err)
	}
	serveBench(b, lim.Handler(noop))
}

func BenchmarkHttprateLocal(b *testing.B) {
	serveBench(b, httprate.Limit(benchRate, time.Hour, httprate.WithKeyFuncs(httprate.KeyByIP))(noop))
}

// BenchmarkDeniedHotKey measures a flood from one client that is over its
// limit (one request an hour): every request is refused, by the store
// each time or, with the deny cache, locally.
func BenchmarkDeniedHotKey(b *testing.B) {
	m := store.NewMemory()
	defer m.Close()
	b.Run("store=memory", func(b *testing.B) { benchDenied(b, m) })
	b.Run("store=redis", func(b *testing.B) {
		srv := redistest.Server(b)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
		b.Cleanup(func() { client.Close() })
		benchDenied(b, store.NewRedis(client, store.WithKeyPrefix(b.Name()+":")))
	})
}

func benchDenied(b *testing.B, s store.Store) {
	for _, bc := range []struct {
		name string
		opts []middleware.Option
	}{
		{"cache=off", nil},
		{"cache=on", []middleware.Option{middleware.WithDenyCache(10_000)}},
	} {
		lim, err := middleware.New(s, store.PerHour(1), append(bc.opts, middleware.WithName("denied-"+bc.name))...)
		if err != nil {
			b.Fatal(err)
		}
		h := lim.Handler(noop)
		r := httptest.NewRequest(http.MethodGet, "/items", nil)
		r.RemoteAddr = "192.0.2.1:4242"
		h.ServeHTTP(&benchWriter{h: http.Header{}}, r) // the hour's one request
		b.Run(bc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			w := &benchWriter{h: http.Header{}}
			for range b.N {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := &benchWriter{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, r)
				}
			})
		})
	}
}
