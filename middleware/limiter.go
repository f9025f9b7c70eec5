package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

var (
	// ErrCostOutOfRange is wrapped by the error of a request whose cost is outside [0, Burst].
	ErrCostOutOfRange = errors.New("middleware: cost out of range")
	// ErrBreakerOpen is wrapped by the error of a decision the open breaker left to the failure policy.
	ErrBreakerOpen = errors.New("middleware: circuit breaker open")
)

// Limiter is rate-limiting middleware for one limit, safe for concurrent use; build it with [New].
type Limiter struct {
	cfg        config
	store      store.Store
	site       string           // where New was called; see WithName
	budget     *store.Budget    // of store calls: nil for a Memory
	plans      map[string]*plan // by tier, for a Multi
	def        *plan            // the plan of a Limiter, and of a Multi's unknown tiers
	of         func(*http.Request) string
	brk        *breaker
	local      *store.Memory // FailLocal's store
	localSwept atomic.Int64  // when the local store was last swept (monotonicNow)
	deny       *denyCache    // nil: no deny cache
	configOnce sync.Once     // logs the first store error that is a configuration error
	keyOnce    sync.Once     // and the first key error that is

	keyErrors   atomic.Int64
	storeErrors atomic.Int64
	denyHits    atomic.Int64
}

// Stats counts the requests a Limiter could not decide or refused locally.
type Stats struct {
	KeyErrors     int64 // KeyFunc errors and costs out of range: refused, never shared
	StoreErrors   int64 // store errors and timeouts: decided by the failure policy
	DenyCacheHits int64 // requests refused by the deny cache (see WithDenyCache), without a store call
}

// New returns a Limiter deciding requests on s under limit, or an error naming what is wrong.
func New(s store.Store, limit store.Limit, opts ...Option) (*Limiter, error) {
	return newLimiter(s, Tiers{Plans: map[string][]Policy{"": {{Limit: limit}}}}, opts, false)
}

// newLimiter returns a Limiter deciding the plans of t, tagged for a Multi.
func newLimiter(s store.Store, t Tiers, opts []Option, tagged bool) (*Limiter, error) {
	if _, ok := s.(store.MultiStore); !ok && tagged && s != nil {
		return nil, fmt.Errorf("middleware: %T cannot decide several limits at once (store.MultiStore)", s)
	}
	defPlan := t.Plans[t.Default]
	if len(defPlan) == 0 {
		return nil, fmt.Errorf("middleware: Tiers: the default tier %q has no policies", t.Default)
	}
	if len(t.Plans) > 1 && t.Of == nil {
		return nil, errors.New("middleware: Tiers: several plans but no Of function")
	}
	if s == nil {
		return nil, errors.New("middleware: nil store")
	}
	if v, ok := s.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil { // a store that cannot decide, or was misconfigured
			return nil, fmt.Errorf("middleware: %w", err)
		}
	}
	if err := defPlan[0].Limit.Validate(); err != nil {
		return nil, fmt.Errorf("middleware: %w", err)
	}
	l := &Limiter{store: s, site: site(), cfg: config{
		timeout:         DefaultTimeout,
		policy:          FailLocal,
		profile:         headers.Default,
		breakerFailures: DefaultBreakerFailures,
		breakerCooldown: DefaultBreakerCooldown,
	}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&l.cfg); err != nil {
			return nil, fmt.Errorf("middleware: %w", err)
		}
	}
	l.cfg.name = cmp.Or(l.cfg.name, DefaultName(defPlan[0].Limit)+"@"+l.site)
	_, mem := s.(*store.Memory)
	_, refunds := s.(store.Refunder)
	_, delays := s.(store.Delayer)
	_, admin := s.(store.Admin)
	switch {
	case l.cfg.refund != nil && !refunds:
		return nil, fmt.Errorf("middleware: WithRefund: %T cannot give tokens back (store.Refunder)", s)
	case l.cfg.penalty != nil && !admin:
		return nil, fmt.Errorf("middleware: WithPenalty: %T cannot block a key (store.Admin)", s)
	case l.cfg.delay > 0 && (!delays || !refunds):
		return nil, fmt.Errorf("middleware: WithDelay: %T cannot take tokens ahead of time and give them back (store.Delayer and store.Refunder)", s)
	}
	if l.cfg.denyKeys > 0 && !l.cfg.dryRun {
		l.deny = newDenyCache(l.cfg.denyKeys)
	}
	if !mem { // the breaker and budget of store calls; failures 0: one that never opens
		l.budget = store.NewBudget(l.cfg.timeout)
		l.brk = &breaker{threshold: cmp.Or(int64(l.cfg.breakerFailures), math.MaxInt64), cooldown: l.cfg.breakerCooldown,
			fair: l.cfg.timeout / 4, onChange: l.breakerChanged}
	}
	if l.cfg.policy.kind == failLocal && !mem { // a Memory store does not fail
		l.local = store.NewMemory(store.WithSweepInterval(0), store.WithMaxKeys(localMaxKeys))
	}
	l.of, l.plans = t.Of, map[string]*plan{}
	for tier, pols := range t.Plans {
		switch {
		case len(pols) == 0:
			return nil, fmt.Errorf("middleware: Tiers: tier %q has no policies", tier)
		case len(pols) > 1 && l.deny != nil:
			return nil, fmt.Errorf("middleware: WithDenyCache: tier %q has several policies, which the store decides together (the deny cache keeps one bucket's denials)", tier)
		case tier != "" && (checkName("", tier) != nil || strings.Contains(tier, "/")):
			return nil, fmt.Errorf("middleware: Tiers: tier %q: printable ASCII without '{', '}', ':' or '/'", tier)
		}
		var ps []policy
		for _, pol := range pols {
			q, err := l.newPolicy(tier, pol, tagged)
			if err != nil {
				return nil, err
			}
			if slices.ContainsFunc(ps, func(o policy) bool { return o.name == q.name }) {
				return nil, fmt.Errorf("middleware: tier %q: two policies named %q", tier, q.name)
			}
			ps = append(ps, q)
		}
		l.plans[tier] = &plan{policies: ps, peer: !slices.ContainsFunc(ps, func(p policy) bool { return p.key != nil })}
	}
	l.def = l.plans[t.Default]
	return l, nil
}

const localMaxKeys = 100_000 // about 8 MB; past it, the local store forgets the fullest buckets

var localSweep = store.DefaultSweepInterval // a variable for tests

// BreakerState returns the state of the limiter's breaker (BreakerClosed if none).
func (l *Limiter) BreakerState() BreakerState {
	if l.brk == nil {
		return BreakerClosed
	}
	return BreakerState(l.brk.state.Load())
}

func (l *Limiter) breakerChanged(from, to BreakerState) {
	cmp.Or(l.cfg.observer, SlogObserver(nil)).Observe(Event{Kind: EventBreaker, Limiter: l.cfg.name, From: from, To: to})
}

// DefaultName returns the start of a default name ([WithName]): "<rate>-per-<period>", plus
// "-burst-<burst>" if the burst is not the rate, "-fixed" or "-sliding" for a window quota; or
// "<rate>-per-month".
func DefaultName(limit store.Limit) string {
	name := strconv.Itoa(limit.Rate) + "-per-" + shortDuration(limit.Period)
	switch {
	case limit.Window != nil && limit.Period == 0: // monthly
		name = strconv.Itoa(limit.Rate) + "-per-month"
	case limit.Window != nil:
		name += "-" + limit.Window.String()
	case limit.Burst != limit.Rate:
		name += "-burst-" + strconv.Itoa(limit.Burst)
	}
	return name
}

// sites counts the limiters made at each place (*atomic.Int64 by place); issued has site's names.
var sites, issued sync.Map

// site hashes (FNV-1a, 8 hex digits) New's caller outside this package and how many limiters it
// made before: the same in replicas making limiters in one order; made unique if it repeats (2^-32).
func site() string {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs[:])])
	self, _ := frames.Next() // this function: its package's prefix
	pkg := strings.TrimSuffix(self.Function, "site")
	f, more := frames.Next()
	for more && strings.HasPrefix(f.Function, pkg) {
		f, more = frames.Next()
	}
	at := self.Function
	if !strings.HasPrefix(f.Function, pkg) {
		at = f.Function + ":" + strconv.Itoa(f.Line)
	}
	made, _ := sites.LoadOrStore(at, new(atomic.Int64))
	h := fnv.New32a()
	h.Write([]byte(at + "#" + strconv.FormatInt(made.(*atomic.Int64).Add(1)-1, 10)))
	return unique(fmt.Sprintf("%08x", h.Sum32()))
}

// unique returns name, or if it was given before name.1, name.2... whichever is new.
func unique(name string) string {
	for i, try := 1, name; ; i++ {
		if _, dup := issued.LoadOrStore(try, true); !dup {
			return try
		}
		try = name + "." + strconv.Itoa(i)
	}
}

// shortDuration formats d in its largest whole unit: 1m rather than 1m0s.
func shortDuration(d time.Duration) string {
	units, i := [...]time.Duration{time.Hour, time.Minute, time.Second, time.Millisecond, time.Microsecond}, 0
	for i < len(units)-1 && d%units[i] != 0 {
		i++
	}
	return strconv.FormatInt(int64(d/units[i]), 10) + [...]string{"h", "m", "s", "ms", "us"}[i]
}

// Name returns the limiter's name.
func (l *Limiter) Name() string { return l.cfg.name }

// StoreKey returns the store key of subject's bucket (a key function's result, "ip:192.0.2.1"),
// for [store.Inspect] and [store.Admin]; on a [Multi], the default plan's first policy's.
func (l *Limiter) StoreKey(subject string) string {
	return string(l.def.policies[0].appendSubject(nil, subject))
}

// Forget drops this server's cached denial of subject ([WithDenyCache]); other servers keep theirs.
func (l *Limiter) Forget(subject string) {
	if l.deny != nil {
		l.deny.probed([]byte(l.StoreKey(subject)), 0)
	}
}

// Limit returns the limiter's limit (a Multi's: its default plan's first).
func (l *Limiter) Limit() store.Limit { return l.def.policies[0].limit }

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{KeyErrors: l.keyErrors.Load(), StoreErrors: l.storeErrors.Load(), DenyCacheHits: l.denyHits.Load()}
}

// Handler returns next wrapped by the limiter (see the package doc).
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { l.serve(w, r, next) })
}

// gone reports whether ctx ended or its deadline passed (go-redis ends a call before ctx's timer).
func gone(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}

// NextToken returns RateLimit's t: the time to res's next whole token (0 if full); a window's res.Next.
func NextToken(res store.Result) time.Duration {
	lim := res.Limit
	if lim.Window != nil {
		return res.Next
	}
	missing := lim.Burst - res.Remaining // whole tokens short of full
	if missing <= 0 || res.ResetAfter <= 0 || lim.Rate <= 0 {
		return 0
	}
	// The next token comes in what ResetAfter leaves after the other missing ones.
	if t := tokenTime(lim, missing-1, false); t >= 0 && t < res.ResetAfter {
		return res.ResetAfter - t
	}
	return 0
}

const textPlain = "text/plain; charset=utf-8"

// deniedBody is the default body of a refusal, shared by every response.
var deniedBody = []byte("429 Too Many Requests: rate limit exceeded, see Retry-After\n")

var goneBody = []byte("503 Service Unavailable: the request's deadline passed before the rate limiter decided\n")

// writeRefusal writes a refusal (no-store if noStore) of type ctype, its fields in one allocation.
func writeRefusal(w http.ResponseWriter, status int, noStore bool, ctype string, body []byte) {
	h := w.Header()
	v := &[3]string{"nosniff", ctype, "no-store"}
	h["X-Content-Type-Options"], h["Content-Type"] = v[0:1:1], v[1:2:2]
	if noStore {
		h["Cache-Control"] = v[2:3:3]
	}
	w.WriteHeader(status)
	w.Write(body)
}

// problemDocument is the RFC 9457 body of a denial by the named policy.
func problemDocument(policy string) []byte {
	name := strconv.Quote(policy) // printable ASCII: a valid JSON string
	return []byte(`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",` +
		`"title":"Request cannot be satisfied as assigned quota has been exceeded",` +
		`"status":429,"violated-policies":[` + name + `]}`)
}

// refuseUnrated counts and reports err, then refuses the request (serves it in dry-run mode).
func (l *Limiter) refuseUnrated(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	l.keyErrors.Add(1)
	l.observe(r, l.cfg.name, Event{Kind: EventError, Err: err, DryRun: l.cfg.dryRun})
	switch {
	case l.cfg.dryRun:
		next.ServeHTTP(w, r)
	case l.cfg.keyError != nil:
		l.cfg.keyError(w, r, err)
	case errors.Is(err, keyfuncs.ErrInvalidConfig): // the server's fault, not the client's
		l.keyOnce.Do(func() { slog.Error("tollgate: the key function is misconfigured", "limiter", l.cfg.name, "error", err) })
		writeRefusal(w, http.StatusInternalServerError, false, textPlain, []byte("500 Internal Server Error: rate limiter misconfigured\n"))
	default:
		writeRefusal(w, http.StatusBadRequest, false, textPlain, []byte("400 Bad Request: the rate limiter cannot rate this request\n"))
	}
}
