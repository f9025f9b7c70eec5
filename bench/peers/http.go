package peers

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/go-chi/httprate"
	"github.com/go-redis/redis_rate/v10"
	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
)

// KeyFunc names the client a request counts against.
type KeyFunc func(r *http.Request) (string, error)

// NewMiddleware returns the library's own net/http middleware for c, keyed
// by key, and a function that releases what it started. redis_rate and
// x/time/rate ship no middleware; theirs here is the minimum: the key, one
// decision, 429 with Retry-After, 500 on a backend error.
func NewMiddleware(c Config, key KeyFunc) (func(http.Handler) http.Handler, func() error, error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	nop := func() error { return nil }
	l := c.Limit
	switch c.Lib {
	case Tollgate:
		st, closeFn := tollgateStore(c)
		opts := []middleware.Option{middleware.WithKeyFunc(keyfuncs.KeyFunc(key)), middleware.WithName("bench")}
		if c.DenyCache != 0 {
			opts = append(opts, middleware.WithDenyCache(c.DenyCache))
		}
		if c.NoHeaders {
			opts = append(opts, middleware.WithHeaders(0))
		}
		lim, err := middleware.New(st, l, opts...)
		if err != nil {
			closeFn()
			return nil, nil, fmt.Errorf("peers: tollgate: %w", err)
		}
		return lim.Handler, closeFn, nil
	case Httprate:
		rl, closeFn := httprateLimiter(c, httprate.WithKeyFuncs(httprate.KeyFunc(key)))
		return rl.Handler, closeFn, nil
	case Ulule:
		lim, err := ululeLimiter(c)
		if err != nil {
			return nil, nil, err
		}
		getter := func(r *http.Request) string {
			k, _ := key(r)
			return k
		}
		return stdlib.NewMiddleware(lim, stdlib.WithKeyGetter(getter)).Handler, nop, nil
	case RedisRate:
		return redisRateMiddleware(redis_rate.NewLimiter(c.Client), redisRateLimit(l), key), nop, nil
	case Throttled:
		rl, err := throttledLimiter(c)
		if err != nil {
			return nil, nil, err
		}
		h := &throttled.HTTPRateLimiterCtx{
			RateLimiter: rl,
			VaryBy: &throttled.VaryBy{Custom: func(r *http.Request) string {
				k, _ := key(r)
				return k
			}},
		}
		return h.RateLimit, nop, nil
	case Sethvargo:
		st, err := memorystore.New(sethvargoConfig(l))
		if err != nil {
			return nil, nil, fmt.Errorf("peers: sethvargo: %w", err)
		}
		mw, err := httplimit.NewMiddleware(st, httplimit.KeyFunc(key))
		if err != nil {
			return nil, nil, fmt.Errorf("peers: sethvargo: %w", err)
		}
		return mw.Handle, sethvargoDecider{st}.Close, nil
	case XRate:
		return xrateMiddleware(newXRateMap(l), key), nop, nil
	}
	return nil, nil, fmt.Errorf("peers: no middleware for %s", c.Lib)
}

func redisRateMiddleware(lim *redis_rate.Limiter, limit redis_rate.Limit, key KeyFunc) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := key(r)
			if err != nil {
				http.Error(w, "no key", http.StatusBadRequest)
				return
			}
			res, err := lim.Allow(r.Context(), k, limit)
			if err != nil {
				http.Error(w, "rate limiter unavailable", http.StatusInternalServerError)
				return
			}
			w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
			if res.Allowed == 0 {
				secs := int64(res.RetryAfter.Seconds()) + 1
				w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
				http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func xrateMiddleware(m *xrateMap, key KeyFunc) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := key(r)
			if err != nil {
				http.Error(w, "no key", http.StatusBadRequest)
				return
			}
			if ok, _ := m.Decide(r.Context(), k); !ok {
				w.Header().Set("Retry-After", "1")
				http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}
