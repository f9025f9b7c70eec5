package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// ErrCostOutOfRange is wrapped by the error given to the key-error handler
// and the error hook when a request's cost is below 0 or above the limit's
// Burst.
var ErrCostOutOfRange = errors.New("middleware: cost out of range")

// Limiter is rate-limiting middleware for one limit. It is safe for
// concurrent use; build it with [New].
type Limiter struct {
	cfg    config
	store  store.Store
	limit  store.Limit
	prefix string   // "{" + name + ":"; see take
	bound  bool     // apply cfg.timeout to store calls
	brk    *breaker // nil: no breaker
	local  *store.Memory
	// localLimit is the limit divided among replicas, for FailLocal.
	localLimit store.Limit

	keyErrors   atomic.Int64
	storeErrors atomic.Int64
}

// Stats counts the requests a Limiter could not decide normally.
type Stats struct {
	KeyErrors   int64 // KeyFunc errors and costs out of range: refused, never shared
	StoreErrors int64 // store errors and timeouts: decided by the failure policy
}

// New returns a Limiter that decides requests on s under limit. It checks
// the limit and every option, and returns an error naming what is wrong.
func New(s store.Store, limit store.Limit, opts ...Option) (*Limiter, error) {
	if s == nil {
		return nil, errors.New("middleware: nil store")
	}
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("middleware: %w", err)
	}
	l := &Limiter{store: s, limit: limit}
	l.cfg = config{
		keyFunc:         keyfuncs.PeerIP,
		timeout:         DefaultTimeout,
		policy:          FailOpen,
		failStatus:      http.StatusServiceUnavailable,
		failRetryAfter:  time.Second,
		profile:         headers.Default,
		replicas:        1,
		breakerFailures: DefaultBreakerFailures,
		breakerCooldown: DefaultBreakerCooldown,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&l.cfg); err != nil {
			return nil, fmt.Errorf("middleware: %w", err)
		}
	}
	if l.cfg.name == "" {
		l.cfg.name = DefaultName(limit)
	}
	l.prefix = "{" + l.cfg.name + ":"
	_, local := s.(*store.Memory) // decides in memory: nothing to wait for
	l.bound = !local
	if !l.cfg.loggerSet {
		l.cfg.logger = slog.Default()
	}
	if l.bound && l.cfg.breakerFailures > 0 {
		l.brk = &breaker{threshold: int64(l.cfg.breakerFailures), cooldown: l.cfg.breakerCooldown, onChange: l.breakerChanged}
	}
	if l.cfg.policy == FailLocal {
		// The same rate over n times the period: exactly 1/n of it.
		l.localLimit = store.Limit{
			Rate:   limit.Rate,
			Period: limit.Period * time.Duration(l.cfg.replicas),
			Burst:  max(1, limit.Burst/l.cfg.replicas),
		}
		if err := l.localLimit.Validate(); err != nil {
			return nil, fmt.Errorf("middleware: WithReplicas(%d): %w", l.cfg.replicas, err)
		}
		// No sweeper goroutine, so nothing to close: full buckets are
		// dropped as they are read and when a shard is at capacity.
		l.local = store.NewMemory(store.WithSweepInterval(0))
	}
	return l, nil
}

// ErrBreakerOpen is wrapped by the error given to the error hook for a
// decision that took the failure policy because the circuit breaker is open.
var ErrBreakerOpen = errors.New("middleware: circuit breaker open")

// BreakerState returns the state of the limiter's circuit breaker
// (always BreakerClosed when it has none).
func (l *Limiter) BreakerState() BreakerState {
	if l.brk == nil {
		return BreakerClosed
	}
	return BreakerState(l.brk.state.Load())
}

func (l *Limiter) breakerChanged(from, to BreakerState) {
	if lg := l.cfg.logger; lg != nil {
		level := slog.LevelInfo
		if to == BreakerOpen {
			level = slog.LevelWarn
		}
		lg.Log(context.Background(), level, "tollgate: circuit breaker "+to.String(),
			"limiter", l.cfg.name, "from", from.String(), "to", to.String())
	}
	if l.cfg.onBreaker != nil {
		l.cfg.onBreaker(l.cfg.name, from, to)
	}
}

// DefaultName is the name a limiter takes from its limit unless [WithName]
// says otherwise: "<rate>-per-<period>", plus "-burst-<burst>" when the
// burst differs from the rate, such as "100-per-1m" or "5-per-1s-burst-10".
func DefaultName(limit store.Limit) string {
	name := strconv.Itoa(limit.Rate) + "-per-" + shortDuration(limit.Period)
	if limit.Burst != limit.Rate {
		name += "-burst-" + strconv.Itoa(limit.Burst)
	}
	return name
}

// shortDuration formats d without zero units: 1m rather than 1m0s.
func shortDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return strconv.FormatInt(int64(d/time.Microsecond), 10) + "us"
}

// Name returns the limiter's name.
func (l *Limiter) Name() string { return l.cfg.name }

// Limit returns the limiter's limit.
func (l *Limiter) Limit() store.Limit { return l.limit }

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{KeyErrors: l.keyErrors.Load(), StoreErrors: l.storeErrors.Load()}
}

// Handler returns next wrapped by the limiter: skip rules, then the KeyFunc,
// the cost, one store decision under the timeout budget, the rate-limit
// headers, and either next or a refusal.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.serve(w, r, next)
	})
}

func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	c := &l.cfg
	if c.skip != nil && c.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	subject, err := c.keyFunc(r)
	if err == nil && subject == "" {
		err = fmt.Errorf("%w: the KeyFunc returned an empty key", keyfuncs.ErrNoKey)
	}
	if err != nil {
		l.refuseUnrated(w, r, fmt.Errorf("middleware: %s: key: %w", c.name, err))
		return
	}
	cost := 1
	if c.cost != nil {
		cost = c.cost(r)
	}
	if cost < 0 || cost > l.limit.Burst {
		l.refuseUnrated(w, r, fmt.Errorf("%w: %s: cost %d outside [0, %d]", ErrCostOutOfRange, c.name, cost, l.limit.Burst))
		return
	}

	res, err := l.decide(r.Context(), subject, cost)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client went away: nobody to answer, and not the store's fault
		}
		l.storeErrors.Add(1)
		if c.onError != nil {
			c.onError(r, fmt.Errorf("middleware: %s: %w", c.name, err))
		}
		switch {
		case c.policy == FailClosed && !c.dryRun:
			l.refuseFailed(w)
			return
		case c.policy == FailLocal:
			res, err = l.local.Take(r.Context(), l.prefix+subject+"}", l.localLimit, cost)
		}
		if err != nil { // FailOpen, or a cost the local share cannot hold
			next.ServeHTTP(w, r) // unlimited, no rate-limit headers
			return
		}
	}

	if !c.dryRun && c.profile != 0 {
		var now time.Time // read only where a header needs the wall clock
		if c.profile&headers.XRateLimitEpoch != 0 {
			now = time.Now()
		}
		headers.Write(w.Header(), c.profile, l.quota(res), now)
	}
	if res.Allowed || c.dryRun {
		if res.Allowed && c.onAllowed != nil {
			c.onAllowed(r, Decision{Limiter: c.name, Key: subject, Cost: cost, Result: res, DryRun: c.dryRun})
		}
		if !res.Allowed && c.onDenied != nil {
			c.onDenied(r, Decision{Limiter: c.name, Key: subject, Cost: cost, Result: res, DryRun: true})
		}
		next.ServeHTTP(w, r)
		return
	}
	if c.onDenied != nil {
		c.onDenied(r, Decision{Limiter: c.name, Key: subject, Cost: cost, Result: res})
	}
	h := w.Header()
	headers.WriteRetryAfter(h, res.RetryAfter)
	h.Set("Cache-Control", "no-store")
	if c.denied != nil {
		c.denied(w, r, res)
		return
	}
	l.writeDenied(w)
}

// decide asks the store through the circuit breaker.
func (l *Limiter) decide(ctx context.Context, subject string, cost int) (store.Result, error) {
	if l.brk == nil {
		return l.take(ctx, subject, cost)
	}
	call, probe := l.brk.allow()
	if !call {
		return store.Result{}, ErrBreakerOpen
	}
	res, err := l.take(ctx, subject, cost)
	// A client that went away says nothing about the store.
	failed := err != nil && ctx.Err() == nil
	l.brk.done(probe, failed)
	return res, err
}

// take asks the store, within the timeout budget unless the store is local.
//
// The store key is "{<name>:<subject>}": braces make the whole key a Redis
// Cluster hash tag. Without them a brace in a subject, as in the route
// pattern "GET /items/{id}", would become the tag and pin every such key
// of every limiter to one slot, one node.
func (l *Limiter) take(ctx context.Context, subject string, cost int) (store.Result, error) {
	key := l.prefix + subject + "}"
	if !l.bound {
		return l.store.Take(ctx, key, l.limit, cost)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	return l.store.Take(ctx, key, l.limit, cost)
}

// quota turns a store result into what the headers report.
func (l *Limiter) quota(res store.Result) headers.Quota {
	return headers.Quota{
		Name:      l.cfg.name,
		Limit:     res.Limit.Burst, // the local share under FailLocal
		Window:    res.Limit.Period,
		Remaining: res.Remaining,
		Reset:     NextToken(res),
	}
}

// NextToken returns the time until the bucket of res gains its next whole
// token: 0 when it is full. It is the t of the RateLimit header.
func NextToken(res store.Result) time.Duration {
	lim := res.Limit
	missing := lim.Burst - res.Remaining // whole tokens short of full
	if missing <= 0 || res.ResetAfter <= 0 || lim.Rate <= 0 {
		return 0
	}
	// ResetAfter covers `missing` tokens: the last missing-1 of them take
	// (missing-1)*Period/Rate; the next token arrives in what is left.
	// 128-bit product: Period*(missing-1) may not fit in 64 bits.
	hi, lo := bits.Mul64(uint64(lim.Period), uint64(missing-1))
	if hi >= uint64(lim.Rate) {
		return res.ResetAfter
	}
	rest, _ := bits.Div64(hi, lo, uint64(lim.Rate))
	next := res.ResetAfter - time.Duration(rest)
	if next <= 0 || rest > uint64(res.ResetAfter) {
		return 0
	}
	return next
}

const deniedBody = "429 Too Many Requests: rate limit exceeded, see Retry-After\n"

func (l *Limiter) writeDenied(w http.ResponseWriter) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	if l.cfg.problemDetails {
		h.Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write(l.problemDocument())
		return
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write([]byte(deniedBody))
}

// problemDocument is the RFC 9457 body of a denial.
func (l *Limiter) problemDocument() []byte {
	name := strconv.Quote(l.cfg.name) // printable ASCII: a valid JSON string
	return []byte(`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",` +
		`"title":"Request cannot be satisfied as assigned quota has been exceeded",` +
		`"status":429,"violated-policies":[` + name + `]}`)
}

// refuseUnrated answers a request the limiter cannot rate.
func (l *Limiter) refuseUnrated(w http.ResponseWriter, r *http.Request, err error) {
	l.keyErrors.Add(1)
	if l.cfg.onError != nil {
		l.cfg.onError(r, err)
	}
	if l.cfg.keyError != nil {
		l.cfg.keyError(w, r, err)
		return
	}
	status, body := http.StatusBadRequest, "400 Bad Request: the rate limiter cannot rate this request\n"
	if errors.Is(err, keyfuncs.ErrInvalidConfig) { // the server's fault, not the client's
		status, body = http.StatusInternalServerError, "500 Internal Server Error: rate limiter misconfigured\n"
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write([]byte(body))
}

// refuseFailed answers a request refused by FailClosed.
func (l *Limiter) refuseFailed(w http.ResponseWriter) {
	h := w.Header()
	if l.cfg.failRetryAfter > 0 {
		headers.WriteRetryAfter(h, l.cfg.failRetryAfter)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(l.cfg.failStatus)
	w.Write([]byte(strconv.Itoa(l.cfg.failStatus) + " " + http.StatusText(l.cfg.failStatus) + ": rate limiter unavailable\n"))
}
