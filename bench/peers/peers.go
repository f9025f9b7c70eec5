// Package peers puts tollgate and the rate limiters it is compared with behind
// one small interface, so that the benchmarks, the HTTP server and the
// accuracy test of the bench module drive every library the same way.
//
// Each library is configured from one [store.Limit] (Rate tokens per Period,
// capacity Burst) as closely as its model allows:
//
//	tollgate    token bucket (GCRA in one Lua script on Redis)    Rate/Period, Burst
//	redis_rate  token bucket (GCRA in one Lua script)             Rate/Period, Burst
//	throttled   token bucket (GCRA; GET+TIME, then a CAS script)  PerDuration(Rate, Period), MaxBurst = Burst-1
//	xrate       x/time/rate per key in a mutex-guarded map        Rate/Period, Burst
//	sethvargo   Tokens refilled every Interval; no separate burst  Tokens = Burst, Interval = Period·Burst/Rate
//	ulule       fixed window counter; no burst                    Limit = Rate per Period
//	httprate    sliding window counter; no burst                  Rate per Period window
//
// Every Redis library gets the same go-redis client, which the caller makes.
package peers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/httprate"
	httprateredis "github.com/go-chi/httprate-redis"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ulememory "github.com/ulule/limiter/v3/drivers/store/memory"
	uleredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	"github.com/tollgate-go/tollgate/store"
)

// Backends.
const (
	Memory = "memory"
	Redis  = "redis"
)

// Library names, as used in flags and benchmark names.
const (
	Tollgate  = "tollgate"
	Httprate  = "httprate"
	Ulule     = "ulule"
	RedisRate = "redis_rate"
	Throttled = "throttled"
	Sethvargo = "sethvargo"
	XRate     = "xrate"
)

// Libs returns the libraries that have a store for backend, tollgate first.
// go-limiter (sethvargo) has no Redis store since v0.6, and x/time/rate is
// in-process only.
func Libs(backend string) []string {
	switch backend {
	case Memory:
		return []string{Tollgate, Httprate, Ulule, Sethvargo, XRate, Throttled}
	case Redis:
		return []string{Tollgate, Httprate, Ulule, RedisRate, Throttled}
	}
	return nil
}

// Config says which library to run, on which backend, under which limit.
// The zero values of Batching and DenyCache leave tollgate's defaults.
type Config struct {
	Lib     string
	Backend string
	// Client is the Redis client of the Redis libraries. It is not closed by
	// Close.
	Client *redis.Client
	Limit  store.Limit
	// Batching, when not nil, is n in tollgate's store.WithBatching(n)
	// (Redis only; 0 turns batching off).
	Batching *int
	// DenyCache, when not 0, is maxKeys in tollgate's
	// middleware.WithDenyCache(maxKeys) (HTTP only).
	DenyCache int
	// NoHeaders turns tollgate's rate-limit headers off (HTTP only).
	NoHeaders bool
}

func (c Config) check() error {
	if err := c.Limit.Validate(); err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	switch c.Backend {
	case Memory:
	case Redis:
		if c.Client == nil {
			return fmt.Errorf("peers: %s on redis: no Redis client", c.Lib)
		}
	default:
		return fmt.Errorf("peers: unknown backend %q (want %s or %s)", c.Backend, Memory, Redis)
	}
	for _, l := range Libs(c.Backend) {
		if l == c.Lib {
			if c.Lib != Tollgate && (c.Batching != nil || c.DenyCache != 0 || c.NoHeaders) {
				return fmt.Errorf("peers: batching and the deny cache are tollgate options, not %s's", c.Lib)
			}
			if c.Batching != nil && c.Backend != Redis {
				return fmt.Errorf("peers: batching needs the redis backend")
			}
			return nil
		}
	}
	return fmt.Errorf("peers: no library %q on %s (have %v)", c.Lib, c.Backend, Libs(c.Backend))
}

// A Decider decides requests of cost 1. It is safe for concurrent use.
type Decider interface {
	// Decide reports whether a request for key is allowed. Over the limit
	// is false with a nil error; errors are the backend's.
	Decide(ctx context.Context, key string) (bool, error)
	// Close releases what the Decider started (not the Redis client).
	Close() error
}

// NewDecider returns the library's decision for c, at the lowest level the
// library offers: a store call, or for httprate (which has no other decision
// API) RateLimiter.OnLimit, which also writes its X-RateLimit-* headers.
func NewDecider(c Config) (Decider, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if c.DenyCache != 0 {
		return nil, errors.New("peers: the deny cache is a middleware option; it has no store-level decision")
	}
	l := c.Limit
	switch c.Lib {
	case Tollgate:
		st, closeFn := tollgateStore(c)
		return &tollgateDecider{st: st, limit: l, close: closeFn}, nil
	case Httprate:
		rl, closeFn := httprateLimiter(c)
		return newHttprateDecider(rl, closeFn), nil
	case Ulule:
		lim, err := ululeLimiter(c)
		if err != nil {
			return nil, err
		}
		return ululeDecider{lim}, nil
	case RedisRate:
		return redisRateDecider{redis_rate.NewLimiter(c.Client), redisRateLimit(l)}, nil
	case Throttled:
		rl, err := throttledLimiter(c)
		if err != nil {
			return nil, err
		}
		return throttledDecider{rl}, nil
	case Sethvargo:
		st, err := memorystore.New(sethvargoConfig(l))
		if err != nil {
			return nil, fmt.Errorf("peers: sethvargo: %w", err)
		}
		return sethvargoDecider{st}, nil
	case XRate:
		return newXRateMap(l), nil
	}
	return nil, fmt.Errorf("peers: no decider for %s", c.Lib)
}

// tollgateStore returns tollgate's store for c and what closes it.
func tollgateStore(c Config) (store.Store, func() error) {
	if c.Backend == Memory {
		m := store.NewMemory()
		return m, m.Close
	}
	var opts []store.RedisOption
	if c.Batching != nil {
		opts = append(opts, store.WithBatching(*c.Batching))
	}
	st := store.NewRedis(c.Client, opts...)
	// A store with batching may run goroutines that a Close stops.
	if cl, ok := any(st).(interface{ Close() error }); ok {
		return st, cl.Close
	}
	return st, func() error { return nil }
}

type tollgateDecider struct {
	st    store.Store
	limit store.Limit
	close func() error
}

func (d *tollgateDecider) Decide(ctx context.Context, key string) (bool, error) {
	r, err := d.st.Take(ctx, key, d.limit, 1)
	return r.Allowed, err
}

func (d *tollgateDecider) Close() error { return d.close() }

// httprateLimiter returns httprate's limiter for c. On Redis the local
// fallback is off, so a Redis error is an error and not a silent in-process
// decision.
func httprateLimiter(c Config, opts ...httprate.Option) (*httprate.RateLimiter, func() error) {
	closeFn := func() error { return nil }
	if c.Backend == Redis {
		counter := httprateredis.NewCounter(&httprateredis.Config{
			Client:           c.Client,
			FallbackDisabled: true,
			PrefixKey:        "httprate",
		})
		// counter.Close would close the shared client.
		opts = append(opts, httprate.WithLimitCounter(counter))
	}
	return httprate.NewRateLimiter(c.Limit.Rate, c.Limit.Period, opts...), closeFn
}

// httprateDecider calls OnLimit with a pooled ResponseWriter and request:
// httprate decides and writes its headers in one call.
type httprateDecider struct {
	rl    *httprate.RateLimiter
	pool  sync.Pool
	close func() error
}

// headerSink is a ResponseWriter that keeps headers and the status of an
// error response, and discards bodies.
type headerSink struct {
	h      http.Header
	status int
	req    *http.Request
}

func (w *headerSink) Header() http.Header         { return w.h }
func (w *headerSink) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerSink) WriteHeader(status int)      { w.status = status }

// errHttprate stands for whatever httprate passed to its error handler.
var errHttprate = errors.New("peers: httprate reported an error")

func newHttprateDecider(rl *httprate.RateLimiter, closeFn func() error) *httprateDecider {
	d := &httprateDecider{rl: rl, close: closeFn}
	d.pool.New = func() any {
		return &headerSink{h: make(http.Header, 8), req: new(http.Request)}
	}
	return d
}

func (d *httprateDecider) Decide(ctx context.Context, key string) (bool, error) {
	w := d.pool.Get().(*headerSink)
	defer d.pool.Put(w)
	clear(w.h)
	w.status = 0
	req := w.req
	if ctx != context.Background() {
		req = req.WithContext(ctx)
	}
	limited := d.rl.OnLimit(w, req, key)
	// OnLimit answers true for a Redis error too, after writing 428
	// Precondition Required through its error handler.
	if limited && w.status == http.StatusPreconditionRequired {
		return false, errHttprate
	}
	return !limited, nil
}

func (d *httprateDecider) Close() error { return d.close() }

func ululeLimiter(c Config) (*ulule.Limiter, error) {
	r := ulule.Rate{Period: c.Limit.Period, Limit: int64(c.Limit.Rate)}
	if c.Backend == Memory {
		return ulule.New(ulememory.NewStore(), r), nil
	}
	st, err := uleredis.NewStoreWithOptions(c.Client, ulule.StoreOptions{Prefix: "ulule"})
	if err != nil {
		return nil, fmt.Errorf("peers: ulule redis store: %w", err)
	}
	return ulule.New(st, r), nil
}

type ululeDecider struct{ lim *ulule.Limiter }

func (d ululeDecider) Decide(ctx context.Context, key string) (bool, error) {
	lc, err := d.lim.Get(ctx, key)
	return err == nil && !lc.Reached, err
}

func (ululeDecider) Close() error { return nil }

func redisRateLimit(l store.Limit) redis_rate.Limit {
	return redis_rate.Limit{Rate: l.Rate, Period: l.Period, Burst: l.Burst}
}

type redisRateDecider struct {
	lim   *redis_rate.Limiter
	limit redis_rate.Limit
}

func (d redisRateDecider) Decide(ctx context.Context, key string) (bool, error) {
	r, err := d.lim.Allow(ctx, key, d.limit)
	if err != nil {
		return false, err
	}
	return r.Allowed > 0, nil
}

func (redisRateDecider) Close() error { return nil }

// throttledLimiter returns throttled's GCRA limiter: its bucket holds
// MaxBurst+1 tokens, so MaxBurst is Burst-1.
func throttledLimiter(c Config) (*throttled.GCRARateLimiterCtx, error) {
	var st throttled.GCRAStoreCtx
	var err error
	if c.Backend == Memory {
		// 0: an unbounded map, memstore's fastest configuration (a bound
		// puts every key behind one LRU).
		st, err = memstore.NewCtx(0)
	} else {
		st, err = goredisstore.NewCtx(c.Client, "throttled:")
	}
	if err != nil {
		return nil, fmt.Errorf("peers: throttled store: %w", err)
	}
	q := throttled.RateQuota{
		MaxRate:  throttled.PerDuration(c.Limit.Rate, c.Limit.Period),
		MaxBurst: c.Limit.Burst - 1,
	}
	rl, err := throttled.NewGCRARateLimiterCtx(st, q)
	if err != nil {
		return nil, fmt.Errorf("peers: throttled: %w", err)
	}
	return rl, nil
}

type throttledDecider struct{ rl *throttled.GCRARateLimiterCtx }

func (d throttledDecider) Decide(ctx context.Context, key string) (bool, error) {
	limited, _, err := d.rl.RateLimitCtx(ctx, key, 1)
	return err == nil && !limited, err
}

func (throttledDecider) Close() error { return nil }

// sethvargoConfig gives go-limiter the capacity and the average rate of l:
// Burst tokens every Burst/Rate periods. (Tokens = Rate per Period would let
// the benchmarks' hot key drain within a run, measuring its denial path.)
func sethvargoConfig(l store.Limit) *memorystore.Config {
	return &memorystore.Config{
		Tokens:   uint64(l.Burst),
		Interval: time.Duration(int64(l.Period) * int64(l.Burst) / int64(l.Rate)),
	}
}

type sethvargoStore interface {
	Take(ctx context.Context, key string) (tokens, remaining, reset uint64, ok bool, err error)
	Close(ctx context.Context) error
}

type sethvargoDecider struct{ st sethvargoStore }

func (d sethvargoDecider) Decide(ctx context.Context, key string) (bool, error) {
	_, _, _, ok, err := d.st.Take(ctx, key)
	return ok, err
}

func (d sethvargoDecider) Close() error { return d.st.Close(context.Background()) }

// xrateMap is the usual hand-rolled limiter: an x/time/rate Limiter per key
// in a map behind one mutex. It never forgets a key.
type xrateMap struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	every rate.Limit
	burst int
}

func newXRateMap(l store.Limit) *xrateMap {
	return &xrateMap{
		m:     make(map[string]*rate.Limiter),
		every: rate.Limit(float64(l.Rate) / l.Period.Seconds()),
		burst: l.Burst,
	}
}

func (x *xrateMap) limiter(key string) *rate.Limiter {
	x.mu.Lock()
	defer x.mu.Unlock()
	l, ok := x.m[key]
	if !ok {
		l = rate.NewLimiter(x.every, x.burst)
		x.m[key] = l
	}
	return l
}

func (x *xrateMap) Decide(_ context.Context, key string) (bool, error) {
	return x.limiter(key).Allow(), nil
}

func (x *xrateMap) Close() error { return nil }

// Describe says how lib models c's limit, for reports.
func Describe(lib string) string {
	switch lib {
	case Tollgate:
		return "token bucket (GCRA); on Redis one EVALSHA per decision, or per batch of concurrent ones (single node)"
	case Httprate:
		return "sliding-window counter, no burst; on Redis MGET, then MULTI/INCRBY/EXPIRE/EXEC when allowed, under a process-wide mutex"
	case Ulule:
		return "fixed-window counter, no burst; one EVALSHA (INCRBY) per decision, denied requests counted too"
	case RedisRate:
		return "token bucket (GCRA), one EVALSHA per decision"
	case Throttled:
		return "token bucket (GCRA); on Redis TIME+GET, then a CAS (EVAL of the whole script, or SETNX+EXPIRE), retried up to 10 times"
	case Sethvargo:
		return "Tokens per Interval, refilled by whole intervals; no separate burst (here Tokens = Burst, Interval = Period·Burst/Rate); in-process only"
	case XRate:
		return "x/time/rate token bucket per key, map behind one mutex; in-process only"
	}
	return ""
}
