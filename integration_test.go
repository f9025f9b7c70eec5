package tollgate_test

// Integration tests against real redis-server processes that the tests start
// themselves (internal/redistest): a single node and a 3-master Cluster.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// accuracy runs a store per client (as app servers, each with its own
// client) on one key, 64 goroutines in all for d at 100/s burst 50, and
// returns allowed / ideal.
func accuracy(t *testing.T, clients []redis.UniversalClient, d time.Duration) float64 {
	t.Helper()
	lim := store.Limit{Rate: 100, Period: time.Second, Burst: 50}
	key := fmt.Sprintf("accuracy:%d", time.Now().UnixNano())
	var allowed, denied, failed atomic.Int64
	ctx := context.Background()
	start := time.Now()
	deadline := start.Add(d)
	var stores []*store.Redis
	for _, c := range clients {
		stores = append(stores, store.NewRedis(c))
	}
	var wg sync.WaitGroup
	for g := range 64 {
		s := stores[g%len(stores)] // shared: its goroutines' Takes are batched together
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				r, err := s.Take(ctx, key, lim, 1)
				switch {
				case err != nil:
					failed.Add(1)
				case r.Allowed:
					allowed.Add(1)
				default:
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	ideal := float64(lim.Burst) + float64(lim.Rate)*elapsed.Seconds()
	ratio := float64(allowed.Load()) / ideal
	t.Logf("4 servers × 16 goroutines for %v: %d allowed, %d denied, %d errors; ideal %.1f; allowed/ideal = %.4f",
		elapsed.Round(time.Millisecond), allowed.Load(), denied.Load(), failed.Load(), ideal, ratio)
	if failed.Load() > 0 {
		t.Errorf("%d Takes failed", failed.Load())
	}
	// The ideal is computed over the wall time the test saw, which exceeds
	// Redis's span of decisions by a little: allow one token above.
	if ratio < 0.97 || float64(allowed.Load()) > ideal+1 {
		t.Errorf("allowed/ideal = %.4f (%d of %.1f); want within [0.97, 1.00] plus one token", ratio, allowed.Load(), ideal)
	}
	return ratio
}

func TestAccuracyAcrossServers(t *testing.T) {
	srv := redistest.Server(t)
	var clients []redis.UniversalClient
	for range 4 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	accuracy(t, clients, 5*time.Second)
}

func TestAccuracyAcrossServersCluster(t *testing.T) {
	cl := redistest.Cluster(t)
	var clients []redis.UniversalClient
	for range 4 {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, PoolSize: 16, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	accuracy(t, clients, 5*time.Second)
}

// commandstats returns the calls per command from INFO commandstats.
func commandstats(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\r\n") {
		// cmdstat_evalsha:calls=100,usec=...
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		calls[name] = n
	}
	return calls
}

func TestOneRoundTripPerTake(t *testing.T) {
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a server of its own: INFO commandstats counts every client")
	}
	admin := srv.Client(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := store.NewRedis(client)
	ctx := context.Background()
	if _, err := s.Take(ctx, "warm", store.PerSecond(10), 1); err != nil { // loads the script, opens a connection
		t.Fatal(err)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := range n {
		if _, err := s.Take(ctx, "k"+strconv.Itoa(i%10), store.PerSecond(10), 1); err != nil {
			t.Fatal(err)
		}
	}
	calls := commandstats(t, admin)
	t.Logf("INFO commandstats after %d Takes: %v", n, calls)
	if calls["evalsha"] != n {
		t.Errorf("evalsha calls = %d, want %d (one per Take)", calls["evalsha"], n)
	}
	for cmd, c := range calls {
		switch cmd {
		case "evalsha", "config|resetstat", "info", "config":
		case "get", "set", "time": // run inside the script: Redis counts them too
		default:
			t.Errorf("unexpected command %s (%d calls)", cmd, c)
		}
	}
}

func TestNoImmortalKeys(t *testing.T) {
	srv := redistest.Server(t)
	admin := srv.Client(t)
	prefix := fmt.Sprintf("ttl%d:", time.Now().UnixNano())
	s := store.NewRedis(admin, store.WithKeyPrefix(prefix))
	ctx := context.Background()
	const n = 10_000
	// A token every 3s: a cost-1 bucket is full again (its key gone) 3s
	// after its Take and a cost-2 one 6s after, which leaves the Takes and
	// the TTL survey below time to finish on a busy machine.
	lim := store.Limit{Rate: 2, Period: 6 * time.Second, Burst: 2}
	pipe := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pipe {
				if _, err := s.Take(ctx, strconv.Itoa(i), lim, 1+i%2); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for i := range n {
		pipe <- i
	}
	close(pipe)
	wg.Wait()

	keys, err := admin.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != n {
		t.Fatalf("%d keys after Takes on %d distinct keys, want %d", len(keys), n, n)
	}
	pipeline := admin.Pipeline()
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		ttls[i] = pipeline.PTTL(ctx, k)
	}
	if _, err := pipeline.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var maxTTL time.Duration
	for i, c := range ttls {
		ttl := c.Val()
		if ttl == -1 || ttl > 6*time.Second {
			t.Fatalf("key %s has PTTL %v; want in (0, 6s]", keys[i], ttl)
		}
		maxTTL = max(maxTTL, ttl)
	}
	t.Logf("%d keys, every one with a TTL; longest %v", len(keys), maxTTL)
	// Every bucket is full again 6s after its last Take: all keys are gone.
	deadline := time.Now().Add(maxTTL + 3*time.Second)
	for {
		left, err := admin.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still exist after their buckets are full again", len(left))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestScriptReloadedAfterFlush(t *testing.T) {
	leaktest.Check(t)
	srv := redistest.Server(t)
	client := srv.Client(t)
	s := store.NewRedis(client)
	ctx := context.Background()
	for i := range 3 {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		r, err := s.Take(ctx, "flush:"+t.Name(), store.PerMinute(10), 1)
		if err != nil || !r.Allowed || r.Remaining != 9-i {
			t.Fatalf("Take %d after SCRIPT FLUSH = %+v, %v", i, r, err)
		}
	}
}

// TestAccuracyDenyCacheAndBatching: 4 app servers, each a middleware with
// its own go-redis client, a batching store and a deny cache, share one
// client's bucket; 64 goroutines send requests for 5 s at 100/s, burst 50.
// The deny cache and batching must not loosen the limit, nor tighten it
// beyond the tolerance, and the cache must spare Redis most calls: they
// follow the tokens that come back, not the requests.
func TestAccuracyDenyCacheAndBatching(t *testing.T) {
	srv := redistest.Server(t)
	lim := store.Limit{Rate: 100, Period: time.Second, Burst: 50}
	prefix := fmt.Sprintf("accuracy-cache:%d:", time.Now().UnixNano())
	var calls atomic.Int64
	var handlers []http.Handler
	for range 4 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		c.AddHook(scriptCounter{&calls})
		l, err := middleware.New(store.NewRedis(c, store.WithKeyPrefix(prefix)), lim,
			middleware.WithName("acc"), middleware.WithKeyFunc(mustKey(keyfuncs.Static("one-client"))),
			middleware.WithDenyCache(1000), middleware.WithTimeout(time.Second), quiet)
		if err != nil {
			t.Fatal(err)
		}
		handlers = append(handlers, l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	}
	var allowed, denied, other atomic.Int64
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	var wg sync.WaitGroup
	for g := range 64 {
		h := handlers[g%len(handlers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
				switch w.Code {
				case http.StatusOK:
					allowed.Add(1)
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	ideal := float64(lim.Burst) + float64(lim.Rate)*elapsed.Seconds()
	ratio := float64(allowed.Load()) / ideal
	perDenied := float64(calls.Load()-allowed.Load()) / float64(max(denied.Load(), 1))
	t.Logf("4 servers × 16 goroutines for %v: %d allowed, %d denied, %d other; ideal %.1f; allowed/ideal = %.4f; "+
		"%d script calls (%.4f per request, %.4f beyond the allowed per denied request)",
		elapsed.Round(time.Millisecond), allowed.Load(), denied.Load(), other.Load(), ideal, ratio,
		calls.Load(), float64(calls.Load())/float64(allowed.Load()+denied.Load()), perDenied)
	if other.Load() > 0 {
		t.Errorf("%d answers other than 200 and 429", other.Load())
	}
	if ratio < 0.97 || float64(allowed.Load()) > ideal+1 {
		t.Errorf("allowed/ideal = %.4f (%d of %.1f); want within [0.97, 1.00] plus one token", ratio, allowed.Load(), ideal)
	}
	// What the cache bounds is the calls per returned token: on each
	// server, one probe each time a token comes back, and then the calls
	// already in flight before its denial is recorded, at most one per
	// goroutine — about 2 per token on an idle machine, more on a loaded
	// one, where answers are slower. Whatever the load, the calls follow
	// the tokens, not the requests: a small share of them.
	perServer := 64 / len(handlers)
	if bound := float64(1+perServer) * float64(len(handlers)) * ideal; float64(calls.Load()) > bound {
		t.Errorf("%d script calls; want at most %.0f (a probe and one call per goroutine per returned token per server)", calls.Load(), bound)
	}
	if requests := allowed.Load() + denied.Load(); calls.Load()*10 > requests {
		t.Errorf("%d script calls for %d requests; want at most a tenth: the deny cache answers the rest", calls.Load(), requests)
	}
}

// scriptCounter counts the script calls a client sends, alone or pipelined.
type scriptCounter struct{ n *atomic.Int64 }

func (h scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// mustKey returns kf, failing the process on err: for KeyFuncs built from
// arguments known to be good.
func mustKey(kf keyfuncs.KeyFunc, err error) keyfuncs.KeyFunc {
	if err != nil {
		panic(err)
	}
	return kf
}

// quiet is an Observer that drops every event: a limiter without one logs
// its breaker's transitions.
var quiet = middleware.WithObserver(middleware.ObserverFunc(func(middleware.Event) {}))
