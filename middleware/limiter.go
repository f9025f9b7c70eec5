package middleware

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/bits"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// ErrCostOutOfRange is wrapped by the error given to the key-error handler
// and the Observer's EventError when a request's cost is below 0 or above the limit's
// Burst.
var ErrCostOutOfRange = errors.New("middleware: cost out of range")

// Limiter is rate-limiting middleware for one limit. It is safe for
// concurrent use; build it with [New].
type Limiter struct {
	cfg    config
	store  store.Store
	limit  store.Limit
	prefix string        // name + ":"; see appendKey
	site   string        // where New was called; see defaultName
	bound  bool          // apply cfg.timeout to store calls
	mem    *store.Memory // the store, if a Memory: decided on the key's bytes
	// configOnce logs the first store error that is a configuration error.
	configOnce sync.Once
	peerIP     bool     // the KeyFunc is keyfuncs.PeerIP; see appendKey
	hooks      bool     // the observer or the allow-list needs the subject as a string
	brk        *breaker // nil: no breaker
	local      *store.Memory
	// localLimit is the limit divided among replicas, for FailLocal.
	localLimit store.Limit
	hdr        *headers.Cache // nil: no rate-limit headers
	deny       *denyCache     // nil: no deny cache
	problem    []byte         // the problem document of a refusal, with WithProblemDetails

	keyErrors   atomic.Int64
	storeErrors atomic.Int64
	denyHits    atomic.Int64
}

// Stats counts the requests a Limiter could not decide normally, and those
// it refused without asking the store.
type Stats struct {
	KeyErrors     int64 // KeyFunc errors and costs out of range: refused, never shared
	StoreErrors   int64 // store errors and timeouts: decided by the failure policy
	DenyCacheHits int64 // requests refused by the deny cache (see WithDenyCache), without a store call
}

// New returns a Limiter that decides requests on s under limit. It checks
// the limit and every option, and returns an error naming what is wrong.
func New(s store.Store, limit store.Limit, opts ...Option) (*Limiter, error) {
	if s == nil {
		return nil, errors.New("middleware: nil store")
	}
	if v, ok := s.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil { // a store that cannot decide, or was misconfigured
			return nil, fmt.Errorf("middleware: %w", err)
		}
	}
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("middleware: %w", err)
	}
	l := &Limiter{store: s, limit: limit}
	l.cfg = config{
		timeout:         DefaultTimeout,
		policy:          FailLocal,
		profile:         headers.Default,
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
	l.site = site()
	if l.cfg.name == "" {
		l.cfg.name = DefaultName(limit) + "@" + l.site
	}
	l.prefix = l.cfg.name + ":"
	l.mem, _ = s.(*store.Memory) // decides in memory: nothing to wait for
	l.bound = l.mem == nil
	if l.peerIP = l.cfg.keyFunc == nil; l.peerIP { // the default, PeerIP: see appendKey
		l.cfg.keyFunc = keyfuncs.PeerIP
	}
	l.hooks = l.cfg.observer != nil || l.cfg.allowKeys != nil
	if l.cfg.refund != nil {
		if _, ok := s.(store.Refunder); !ok {
			return nil, fmt.Errorf("middleware: WithRefund: %T cannot give tokens back (store.Refunder)", s)
		}
	}
	if l.cfg.profile != 0 && !l.cfg.dryRun {
		l.hdr = headers.NewCache(l.cfg.profile, l.cfg.name, limit.Burst, limit.Rate, limit.Period)
	}
	if l.cfg.problemDetails {
		l.problem = l.problemDocument()
	}
	if l.cfg.denyKeys > 0 && !l.cfg.dryRun {
		l.deny = newDenyCache(l.cfg.denyKeys)
	}
	if l.bound && l.cfg.breakerFailures > 0 {
		l.brk = &breaker{threshold: int64(l.cfg.breakerFailures), cooldown: l.cfg.breakerCooldown, onChange: l.breakerChanged}
	}
	if l.cfg.policy.kind == failLocal && l.bound { // a Memory store does not fail
		// The same rate over n times the period: exactly 1/n of it.
		l.localLimit = store.Limit{
			Rate:   limit.Rate,
			Period: limit.Period * time.Duration(l.cfg.policy.replicas),
			Burst:  max(1, limit.Burst/l.cfg.policy.replicas),
		}
		if err := l.localLimit.Validate(); err != nil {
			return nil, fmt.Errorf("middleware: FailLocalShare(%d): %w", l.cfg.policy.replicas, err)
		}
		// No sweeper goroutine, so nothing to close: full buckets are
		// dropped as they are read and when room is needed. At most
		// localMaxKeys of them (about 16 MB): past that the local limit
		// forgets the buckets nearest to full, which only the fallback feels.
		l.local = store.NewMemory(store.WithSweepInterval(0), store.WithMaxKeys(localMaxKeys))
	}
	return l, nil
}

// localMaxKeys bounds the buckets of FailLocal's in-process store.
const localMaxKeys = 100_000

// ErrBreakerOpen is wrapped by the error of an EventError for a
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

// reportConfig logs, once per limiter, a store error that no retry will
// cure (the Redis user may not run the script; see store.Redis.Check): the
// failure policy decides every request until it is fixed.
func (l *Limiter) reportConfig(err error) {
	if scriptRefused(err) {
		l.configOnce.Do(func() {
			slog.Error("tollgate: the store cannot run its script; the failure policy decides every request "+
				"until this is fixed (store.Redis.Check names what to grant)", "limiter", l.cfg.name, "error", err)
		})
	}
}

// breakerChanged reports a transition to the Observer, or without one to
// slog.Default, as SlogObserver would.
func (l *Limiter) breakerChanged(from, to BreakerState) {
	o := l.cfg.observer
	if o == nil {
		o = SlogObserver(nil)
	}
	o.Observe(Event{Kind: EventBreaker, Limiter: l.cfg.name, From: from, To: to})
}

// DefaultName is what a limiter's default name starts with: "<rate>-per-<period>",
// plus "-burst-<burst>" when the burst differs from the rate, such as
// "100-per-1m" or "5-per-1s-burst-10". Unless [WithName] says otherwise, the
// name is DefaultName, "@" and 8 hex digits naming where the limiter was made
// (see [WithName]), such as "100-per-1m@9c1d02e7".
func DefaultName(limit store.Limit) string {
	name := strconv.Itoa(limit.Rate) + "-per-" + shortDuration(limit.Period)
	if limit.Burst != limit.Rate {
		name += "-burst-" + strconv.Itoa(limit.Burst)
	}
	return name
}

// sites counts the limiters made at each place in the code, so that two
// made at one place (a loop, a helper) get different default names too.
var sites = struct {
	sync.Mutex
	made map[string]int
}{made: map[string]int{}}

// site names the caller of New outside this package, and how many limiters
// it made before, in 8 hex digits of their FNV-1a hash: the same in every
// replica of a program that makes its limiters in the same order, and never
// the same for two limiters of one process (but by a 2^-32 chance).
func site() string {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs[:])])
	self, _ := frames.Next() // this function: its package's prefix
	pkg := strings.TrimSuffix(self.Function, "site")
	at := self.Function
	for f, more := frames.Next(); ; f, more = frames.Next() {
		if !strings.HasPrefix(f.Function, pkg) {
			at = f.Function + ":" + strconv.Itoa(f.Line)
			break
		}
		if !more {
			break
		}
	}
	sites.Lock()
	n := sites.made[at]
	sites.made[at] = n + 1
	sites.Unlock()
	h := fnv.New32a()
	h.Write([]byte(at + "#" + strconv.Itoa(n)))
	return fmt.Sprintf("%08x", h.Sum32())
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
	return Stats{KeyErrors: l.keyErrors.Load(), StoreErrors: l.storeErrors.Load(), DenyCacheHits: l.denyHits.Load()}
}

// Handler returns next wrapped by the limiter: skip rules, then the KeyFunc,
// the cost, the deny cache if any, one store decision under the timeout
// budget, the rate-limit headers, and either next or a refusal.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.serve(w, r, next)
	})
}

// keyBuf holds the store key of a request while it is decided. The buffers
// are pooled so that building a key allocates nothing; see take.
type keyBuf struct{ b []byte }

var keyBufs = sync.Pool{New: func() any { return &keyBuf{b: make([]byte, 0, 128)} }}

// maxPooledKey bounds the buffers kept in keyBufs: one grown for a huge key
// is dropped rather than kept.
const maxPooledKey = 1024

func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	c := &l.cfg
	allowed, resolved := c.allowedResolved(r)
	if !resolved && l.peerIP {
		allowed, resolved = c.allowedPeer(r), true // the default key: the peer
	}
	if (c.skip != nil && c.skip(r)) || allowed {
		l.observe(r, Event{Kind: EventSkipped})
		next.ServeHTTP(w, r)
		return
	}
	kr, slot := slotted(r, resolved)
	kb := keyBufs.Get().(*keyBuf)
	key, subject, err := l.appendKey(kb.b[:0], kr)
	if cap(key) <= maxPooledKey {
		kb.b = key[:0]
	}
	if !resolved && c.allowedAt(r, *slot) { // an allow-listed client needs no key
		keyBufs.Put(kb)
		l.observe(r, Event{Kind: EventSkipped, Key: subject})
		next.ServeHTTP(w, r)
		return
	}
	if err != nil {
		keyBufs.Put(kb)
		l.refuseUnrated(w, r, next, fmt.Errorf("middleware: %s: key: %w", c.name, err))
		return
	}
	cost := 1
	if c.cost != nil {
		cost = c.cost(r)
	}
	if cost < 0 || cost > l.limit.Burst {
		keyBufs.Put(kb)
		l.refuseUnrated(w, r, next, fmt.Errorf("%w: %s: cost %d outside [0, %d]", ErrCostOutOfRange, c.name, cost, l.limit.Burst))
		return
	}
	if subject == "" && l.hooks {
		subject = string(key[len(l.prefix):]) // PeerIP: "<name>:<address>", never wrapped
	}
	if c.allowKeys != nil && c.allowKeys[subject] {
		keyBufs.Put(kb)
		l.observe(r, Event{Kind: EventSkipped, Key: subject})
		next.ServeHTTP(w, r)
		return
	}
	d := decision{subject: subject, cost: cost}
	if c.refund != nil && cost > 0 {
		d.refundKey = string(key) // kept past the pooled buffer
	}
	var start time.Time
	if c.observer != nil {
		start = time.Now()
	}
	res, local, err := l.decideKey(r.Context(), key, cost)
	if c.observer != nil {
		d.latency, d.local = time.Since(start), local
	}
	if err != nil {
		if gone(r.Context()) {
			keyBufs.Put(kb)
			return // the client went away: nobody to answer, and not the store's fault
		}
		l.storeErrors.Add(1)
		err = fmt.Errorf("middleware: %s: %w", c.name, err)
		l.reportConfig(err)
		l.observe(r, Event{Kind: EventError, Key: subject, Cost: cost, Latency: d.latency, Err: err})
		l.observe(r, Event{Kind: EventFallback, Key: subject, Cost: cost, Policy: c.policy, Err: err, DryRun: c.dryRun})
		switch {
		case c.policy.kind == failClosed && !c.dryRun:
			keyBufs.Put(kb)
			l.refuseFailed(w)
			return
		case c.policy.kind == failLocal && l.local != nil:
			res, err = l.local.TakeBytes(r.Context(), key, l.localLimit, cost)
			d.local, d.refundKey = true, "" // nothing to give back to the store
		}
		if err != nil { // FailOpen, or a cost the local share cannot hold
			keyBufs.Put(kb)
			next.ServeHTTP(w, r) // unlimited, no rate-limit headers
			return
		}
	} else if l.local != nil && res.Allowed && cost > 0 && !local {
		// The local bucket follows what this server let through, so that a
		// switch to FailLocal starts from it: a client that was flooding
		// gets no fresh burst per outage. (One Memory decision per allowed
		// request, 0.1-0.5 µs, against tens of µs for the Redis round trip.)
		l.local.TakeBytes(r.Context(), key, l.localLimit, cost)
	}
	keyBufs.Put(kb) // the key is not used past here: next may take long
	l.respond(w, r, next, res, &d)
}

// decision is what respond needs to know about a request besides the
// store's answer.
type decision struct {
	subject   string
	cost      int
	latency   time.Duration
	local     bool   // decided in process (deny cache, FailLocal)
	refundKey string // the store key, when a refund rule may give the tokens back
}

// observe sends e, from this limiter, to the observer if there is one.
func (l *Limiter) observe(r *http.Request, e Event) {
	if o := l.cfg.observer; o != nil {
		e.Limiter, e.Request, e.KeyClass = l.cfg.name, r, KeyClass(e.Key)
		if e.Key == "" {
			e.KeyClass = "none"
		}
		o.Observe(e)
	}
}

// respond writes the headers of a decision and serves or refuses the request.
func (l *Limiter) respond(w http.ResponseWriter, r *http.Request, next http.Handler, res store.Result, d *decision) {
	c := &l.cfg
	subject, cost := d.subject, d.cost
	if c.observer != nil {
		kind := EventAllowed
		if !res.Allowed {
			kind = EventDenied
		}
		l.observe(r, Event{Kind: kind, Key: subject, Cost: cost, Latency: d.latency,
			Result: res, Local: d.local, DryRun: c.dryRun})
	}
	var now time.Time // read only where a header needs the wall clock
	if c.profile&headers.XRateLimitEpoch != 0 && l.hdr != nil {
		now = time.Now()
	}
	if res.Allowed || c.dryRun {
		if l.hdr != nil { // nil in dry-run mode
			l.hdr.Write(w.Header(), l.quota(res), now)
		}
		if d.refundKey != "" && res.Allowed {
			l.serveRefunding(w, r, next, d.refundKey, cost)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	if l.hdr != nil {
		l.hdr.WriteDenied(h, l.quota(res), res.RetryAfter, now)
	} else {
		headers.WriteRetryAfter(h, res.RetryAfter)
	}
	if c.denied != nil {
		h["Cache-Control"] = []string{"no-store"} // the canonical key Header.Set would compute
		c.denied(w, r, res)
		return
	}
	l.writeDenied(w, h)
}

// appendKey appends the store key of r to b: "<name>:<subject>", which the
// store prefixes ("tollgate:<name>:<subject>"). A subject that holds a
// brace, as the route pattern "GET /items/{id}" does, is wrapped with the
// name in braces, "{<name>:<subject>}", which makes the whole of it the
// Redis Cluster hash tag: the subject's own braces would otherwise become
// the tag and pin every such key of every limiter to one slot, one node.
//
// subject is the KeyFunc's result, or "" for the default key function,
// PeerIP, whose key (an address, never a brace) is appended without being
// allocated first.
func (l *Limiter) appendKey(b []byte, r *http.Request) (key []byte, subject string, err error) {
	if l.peerIP {
		b = append(b, l.prefix...)
		b, err = keyfuncs.AppendPeerIP(b, r)
		return b, "", err
	}
	subject, err = l.cfg.keyFunc(r)
	if err == nil && subject == "" {
		err = fmt.Errorf("%w: the KeyFunc returned an empty key", keyfuncs.ErrNoKey)
	}
	if strings.IndexByte(subject, '{') < 0 {
		b = append(b, l.prefix...)
		return append(b, subject...), subject, err
	}
	b = append(b, '{')
	b = append(b, l.prefix...)
	b = append(b, subject...)
	return append(b, '}'), subject, err
}

// decideKey decides a request of cost on the store key held in key: from
// the deny cache if it refuses it, otherwise by the store, whose denial
// the deny cache then records.
func (l *Limiter) decideKey(ctx context.Context, key []byte, cost int) (_ store.Result, local bool, _ error) {
	if l.deny == nil || cost == 0 { // a read takes nothing: never refused locally
		res, err := l.decide(ctx, key, cost)
		return res, false, err
	}
	verdict, res, gen := l.deny.check(key, l.limit, cost)
	if verdict == denyHit {
		l.denyHits.Add(1)
		return res, true, nil
	}
	res, err := l.decide(ctx, key, cost)
	switch {
	case err == nil && !res.Allowed:
		l.deny.denied(key, l.limit, cost, res)
	case verdict == denyProbe && err == nil && res.Remaining < cost:
		// The probe took the tokens that came back and left fewer than
		// cost: the next request of this cost would be denied until the
		// bucket holds cost again, at ResetAfter - (Burst-cost)*T, which
		// the answer gives exactly (less a microsecond for its rounding).
		// Keep refusing locally until then.
		wait := res.ResetAfter - tokenTimeUp(l.limit, l.limit.Burst-cost) - time.Microsecond
		if wait > 0 {
			l.deny.denied(key, l.limit, cost, store.Result{RetryAfter: wait, ResetAfter: res.ResetAfter})
		} else {
			l.deny.probed(key, gen)
		}
	case verdict == denyProbe: // allowed with room left, or no answer: ask the store again
		l.deny.probed(key, gen)
	}
	return res, false, err
}

// decide asks the store through the circuit breaker.
func (l *Limiter) decide(ctx context.Context, key []byte, cost int) (store.Result, error) {
	if l.brk == nil {
		return l.take(ctx, key, cost)
	}
	call, probe := l.brk.allow()
	if !call {
		return store.Result{}, ErrBreakerOpen
	}
	var res store.Result
	var err error
	l.brk.call(ctx, probe, func() error {
		res, err = l.take(ctx, key, cost)
		return err
	})
	return res, err
}

// gone reports whether the request's context ctx has ended: cancelled, or
// past its deadline. The deadline is also read on the clock because a
// go-redis client with ContextTimeoutEnabled ends its call at that deadline
// itself, and its error usually comes back before the context's own timer
// has marked ctx done.
func gone(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// take asks the store, within the timeout budget unless the store is local,
// for the key held in key: a Memory store reads its bytes, which the caller
// reuses after, and another store gets a copy (Redis hands its key to a
// client that can outlive the call).
func (l *Limiter) take(ctx context.Context, key []byte, cost int) (store.Result, error) {
	if l.mem != nil {
		return l.mem.TakeBytes(ctx, key, l.limit, cost)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	return l.store.Take(ctx, string(key), l.limit, cost)
}

// quota turns a store result into what the headers report.
func (l *Limiter) quota(res store.Result) headers.Quota {
	return headers.Quota{
		Name:      l.cfg.name,
		Limit:     res.Limit.Burst, // the local share under FailLocal
		Rate:      res.Limit.Rate,
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

// deniedBody is the default body of a refusal. Writers must not change
// what they are given to write, so every response can share it.
var deniedBody = []byte("429 Too Many Requests: rate limit exceeded, see Retry-After\n")

// writeDenied writes the default refusal, h being w's header.
func (l *Limiter) writeDenied(w http.ResponseWriter, h http.Header) {
	l.writeDeniedAs(w, h, l.problem)
}

// writeDeniedAs writes the default refusal with problem as its
// application/problem+json body, when the limiter writes one.
func (l *Limiter) writeDeniedAs(w http.ResponseWriter, h http.Header, problem []byte) {
	// The three fields in one allocation, under the canonical keys that
	// Header.Set would compute. They are this response's own: code after
	// us may write into them.
	v := &[3]string{"no-store", "nosniff", "text/plain; charset=utf-8"}
	body := deniedBody
	if l.problem != nil {
		v[2], body = "application/problem+json", problem
	}
	h["Cache-Control"] = v[0:1:1]
	h["X-Content-Type-Options"] = v[1:2:2]
	h["Content-Type"] = v[2:3:3]
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(body)
}

// problemDocument is the RFC 9457 body of a denial.
func (l *Limiter) problemDocument() []byte { return problemDocument(l.cfg.name) }

// problemDocument is the RFC 9457 body of a denial by the policy named
// policy.
func problemDocument(policy string) []byte {
	name := strconv.Quote(policy) // printable ASCII: a valid JSON string
	return []byte(`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",` +
		`"title":"Request cannot be satisfied as assigned quota has been exceeded",` +
		`"status":429,"violated-policies":[` + name + `]}`)
}

// refuseUnrated answers a request the limiter cannot rate: it counts and
// reports err, then refuses the request, or serves it with next in dry-run
// mode, which never refuses.
func (l *Limiter) refuseUnrated(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	l.keyErrors.Add(1)
	l.observe(r, Event{Kind: EventError, Err: err, DryRun: l.cfg.dryRun})
	if l.cfg.dryRun {
		next.ServeHTTP(w, r)
		return
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
	if p := l.cfg.policy; p.retryAfter > 0 {
		headers.WriteRetryAfter(h, p.retryAfter)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	status := l.cfg.policy.status
	w.WriteHeader(status)
	w.Write([]byte(strconv.Itoa(status) + " " + http.StatusText(status) + ": rate limiter unavailable\n"))
}
