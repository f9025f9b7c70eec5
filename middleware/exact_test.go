package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
	"github.com/tollgate-go/tollgate/storetest"
)

// The exactness of the whole request path on the real clock, with many
// more goroutines than cores: a limiter, two limiters that share a name
// (so their buckets), a Multi with a global policy, and the FailLocal
// fallback of both, each serving no more than its limit's Burst + Rate·T.

const exactRun = 300 * time.Millisecond

// flood serves requests from g goroutines for d, each with the X-Client
// header client(r) and the path path(r), and returns the 200s per path and
// the time from before the first request to after the last.
func hammerHTTP(h http.Handler, g int, d time.Duration, path func(i int) string) (map[string]int64, time.Duration) {
	var mu sync.Mutex
	served := map[string]int64{}
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := map[string]int64{}
			for i := w; time.Now().Before(stop); i += g {
				p := path(i)
				req := httptest.NewRequest(http.MethodGet, p, nil)
				req.Header.Set("X-Client", "alice")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code == http.StatusOK {
					n[p]++
				}
			}
			mu.Lock()
			for p, c := range n {
				served[p] += c
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return served, time.Since(start)
}

func judge(t *testing.T, what string, lim store.Limit, served int64, elapsed time.Duration) {
	t.Helper()
	max := storetest.Allowance(lim, elapsed)
	t.Logf("exactness: %s served %d, %.3f× Burst + Rate·T", what, served, float64(served)/(max-1))
	if float64(served) > max {
		t.Errorf("%s: %v served %d in %v; want at most %.1f", what, lim, served, elapsed, max)
	}
}

var okServe = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })

// deadStore is a Redis store on a closed port: every decision fails at
// once, so the failure policy decides.
func deadStore(t *testing.T) *store.Redis {
	client := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	return store.NewRedis(client)
}

func TestExactUnderContention(t *testing.T) {
	lim := store.Limit{Rate: 100, Period: time.Second, Burst: 50}
	for _, g := range storetest.Goroutines {
		t.Run(fmt.Sprintf("g%d", g), func(t *testing.T) {
			t.Run("Limiter", func(t *testing.T) {
				m := store.NewMemory()
				t.Cleanup(func() { m.Close() })
				l, err := middleware.New(m, lim, middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Client"))))
				if err != nil {
					t.Fatal(err)
				}
				served, elapsed := hammerHTTP(l.Handler(okServe), g, exactRun, func(int) string { return "/" })
				judge(t, "limiter", lim, served["/"], elapsed)
				if served["/"] < int64(lim.Burst) {
					t.Errorf("served %d; want at least the burst, %d", served["/"], lim.Burst)
				}
			})
			t.Run("SharedName", func(t *testing.T) {
				// Two route groups whose limiters share a name share buckets:
				// each still serves no more than its own limit (the looser
				// one may serve nothing while the tighter one's debt is
				// above its capacity).
				m := store.NewMemory()
				t.Cleanup(func() { m.Close() })
				read := store.PerSecond(10)
				write := store.Limit{Rate: 1, Period: time.Second, Burst: 2}
				lr, err := middleware.New(m, read, middleware.WithName("api"), middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Client"))))
				if err != nil {
					t.Fatal(err)
				}
				lw, err := middleware.New(m, write, middleware.WithName("api"), middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Client"))))
				if err != nil {
					t.Fatal(err)
				}
				mux := http.NewServeMux()
				mux.Handle("/read", lr.Handler(okServe))
				mux.Handle("/write", lw.Handler(okServe))
				served, elapsed := hammerHTTP(mux, g, exactRun, func(i int) string {
					if i%2 == 0 {
						return "/read"
					}
					return "/write"
				})
				judge(t, "/read", read, served["/read"], elapsed)
				judge(t, "/write", write, served["/write"], elapsed)
			})
			for _, failing := range []bool{false, true} {
				name := "Multi"
				if failing {
					name = "MultiFailLocal"
				}
				t.Run(name, func(t *testing.T) {
					var s store.Store
					if failing {
						s = deadStore(t)
					} else {
						m := store.NewMemory()
						t.Cleanup(func() { m.Close() })
						s = m
					}
					user := store.Limit{Rate: 40, Period: time.Second, Burst: 20}
					global := store.Limit{Rate: 100, Period: time.Second, Burst: 50}
					mu, err := middleware.NewMulti(s, []middleware.Policy{
						{Name: "user", Limit: user},
						{Name: "global", Limit: global, Key: mustKey(keyfuncs.Static("all"))},
					}, middleware.WithKeyFunc(func(r *http.Request) (string, error) { return r.URL.Query().Get("u"), nil }),
						middleware.WithFailurePolicy(middleware.FailLocal))
					if err != nil {
						t.Fatal(err)
					}
					var perUser [8]atomic.Int64
					h := mu.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						n, _ := strconv.Atoi(r.URL.Query().Get("u"))
						perUser[n].Add(1)
					}))
					served, elapsed := hammerHTTP(h, g, exactRun, func(i int) string { return "/?u=" + strconv.Itoa(i%8) })
					var all int64
					for _, n := range served {
						all += n
					}
					judge(t, "global", global, all, elapsed)
					for i := range perUser {
						if max := storetest.Allowance(user, elapsed); float64(perUser[i].Load()) > max {
							t.Errorf("user %d: served %d in %v; want at most %.1f", i, perUser[i].Load(), elapsed, max)
						}
					}
				})
			}
			t.Run("LimiterFailLocal", func(t *testing.T) {
				l, err := middleware.New(deadStore(t), lim, middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Client"))),
					middleware.WithFailurePolicy(middleware.FailLocal))
				if err != nil {
					t.Fatal(err)
				}
				served, elapsed := hammerHTTP(l.Handler(okServe), g, exactRun, func(int) string { return "/" })
				judge(t, "FailLocal", lim, served["/"], elapsed)
			})
		})
	}
}
