package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// Policy is one of the limits a [Multi] enforces on a request: 10/s and
// 1000/h per user, 100/s per route, 5000/s for everyone.
type Policy struct {
	// Name names the policy's buckets and its item in the RateLimit
	// headers; unique within a tier. The rules of [WithName] apply; empty
	// means [DefaultName] of Limit.
	Name  string
	Limit store.Limit
	// Key finds the policy's subject; nil means the limiter's key
	// function ([WithKeyFunc]). A global limit uses keyfuncs.Static.
	Key keyfuncs.KeyFunc
}

// Tiers gives each request its policies, chosen by a function of the
// request (its plan, its API key), so that plans change without rebuilding
// the middleware.
type Tiers struct {
	// Of returns the request's tier. A tier not in Plans (including "")
	// is the Default tier.
	Of func(r *http.Request) string
	// Plans are the policies of each tier.
	Plans map[string][]Policy
	// Default is the tier of requests whose tier is unknown; it must be
	// one of Plans. Give it the strictest plan: a request that names no
	// plan, or a plan that does not exist, should not get more than a
	// free one.
	Default string
}

// Multi is rate-limiting middleware that decides several limits per
// request at once: the request passes only if every policy allows it, and
// a request refused by one policy consumes from none (see
// [store.MultiStore]). Build it with [NewMulti] or [NewTiered].
//
// Every policy is reported in the RateLimit / RateLimit-Policy Lists; the
// single-value RateLimit-Limit/-Remaining/-Reset report the tightest, and a
// 429's Retry-After is the latest over the violated policies. The bucket of
// a policy is "<name>:{<subject>}" (or "<tier>/<name>:{<subject>}" for a
// tier other than ""), so the policies of one subject share a Redis Cluster
// hash tag and are decided in one atomic script call; policies on other
// subjects (a global limit) are decided by further calls — see
// [store.Redis.TakeAll] for their order and what a failure between them
// means.
//
// All of the Options of [New] apply, except [WithDenyCache], which is an
// error, and [WithName], which names the middleware in errors, logs and
// problem documents (each policy has a name of its own). With [WithCost], the cost is taken from every policy.
// FailLocal divides every policy among the replicas.
type Multi struct {
	base  *Limiter // the configuration and the shared refusal paths
	ms    store.MultiStore
	of    func(*http.Request) string
	plans map[string]*plan
	def   *plan
}

type plan struct {
	policies []policy
}

type policy struct {
	name   string // in the headers
	event  string // in events: "<tier>/<name>", or name
	limit  store.Limit
	local  store.Limit // FailLocal's share
	key    keyfuncs.KeyFunc
	prefix string // "<tier>/<name>:{"
	// problem is the application/problem+json body of a denial by this
	// policy, when the middleware writes one.
	problem []byte
}

// NewMulti returns middleware that enforces every one of policies on each
// request, on a store that decides several buckets at once.
func NewMulti(s store.Store, policies []Policy, opts ...Option) (*Multi, error) {
	return NewTiered(s, Tiers{Plans: map[string][]Policy{"": policies}}, opts...)
}

// NewTiered returns middleware that enforces on each request the policies
// of its tier.
func NewTiered(s store.Store, t Tiers, opts ...Option) (*Multi, error) {
	ms, ok := s.(store.MultiStore)
	if !ok {
		if s == nil {
			return nil, errors.New("middleware: nil store")
		}
		return nil, fmt.Errorf("middleware: %T cannot decide several limits at once (store.MultiStore)", s)
	}
	defPlan, ok := t.Plans[t.Default]
	if !ok || len(defPlan) == 0 {
		return nil, fmt.Errorf("middleware: Tiers: the default tier %q has no policies", t.Default)
	}
	if len(t.Plans) > 1 && t.Of == nil {
		return nil, errors.New("middleware: Tiers: several plans but no Of function")
	}
	base, err := New(s, defPlan[0].Limit, opts...)
	if err != nil {
		return nil, err
	}
	if base.deny != nil {
		return nil, errors.New("middleware: WithDenyCache: a Multi has no deny cache (use it on a Limiter)")
	}
	m := &Multi{base: base, ms: ms, of: t.Of, plans: map[string]*plan{}}
	for tier, pols := range t.Plans {
		if len(pols) == 0 {
			return nil, fmt.Errorf("middleware: Tiers: tier %q has no policies", tier)
		}
		if tier != "" {
			if err := WithName(tier)(&config{}); err != nil || strings.Contains(tier, "/") {
				return nil, fmt.Errorf("middleware: Tiers: tier %q: printable ASCII without '{', '}', ':' or '/'", tier)
			}
		}
		p := &plan{}
		for _, pol := range pols {
			q, err := m.policy(tier, pol)
			if err != nil {
				return nil, err
			}
			if slices.ContainsFunc(p.policies, func(o policy) bool { return o.name == q.name }) {
				return nil, fmt.Errorf("middleware: tier %q: two policies named %q", tier, q.name)
			}
			p.policies = append(p.policies, q)
		}
		m.plans[tier] = p
	}
	m.def = m.plans[t.Default]
	return m, nil
}

func (m *Multi) policy(tier string, p Policy) (policy, error) {
	if err := p.Limit.Validate(); err != nil {
		return policy{}, fmt.Errorf("middleware: tier %q: %w", tier, err)
	}
	name := p.Name
	if name == "" {
		name = DefaultName(p.Limit) + "@" + m.base.site
	}
	if err := WithName(name)(&config{}); err != nil {
		return policy{}, fmt.Errorf("middleware: tier %q: policy: %w", tier, err)
	}
	if strings.Contains(name, "/") {
		return policy{}, fmt.Errorf("middleware: tier %q: policy %q: '/' is not allowed (it separates tier and policy)", tier, name)
	}
	q := policy{name: name, event: name, limit: p.Limit, key: p.Key, prefix: name + ":{", problem: problemDocument(name)}
	if tier != "" {
		q.prefix = tier + "/" + q.prefix
		q.event = tier + "/" + name
	}
	if q.key == nil {
		q.key = m.base.cfg.keyFunc
	}
	if c := &m.base.cfg; c.policy.kind == failLocal && m.base.local != nil {
		q.local = store.Limit{
			Rate:   p.Limit.Rate,
			Period: p.Limit.Period * time.Duration(c.policy.replicas),
			Burst:  max(1, p.Limit.Burst/c.policy.replicas),
		}
		if err := q.local.Validate(); err != nil {
			return policy{}, fmt.Errorf("middleware: FailLocalShare(%d): %w", c.policy.replicas, err)
		}
	}
	return q, nil
}

// Handler returns next wrapped by the middleware.
func (m *Multi) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// Stats returns the middleware's counters.
func (m *Multi) Stats() Stats { return m.base.Stats() }

// BreakerState returns the state of the circuit breaker in front of the
// store.
func (m *Multi) BreakerState() BreakerState { return m.base.BreakerState() }

func (m *Multi) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	l := m.base
	c := &l.cfg
	p := m.def
	if m.of != nil {
		if q, ok := m.plans[m.of(r)]; ok {
			p = q
		}
	}
	allowed, resolved := c.allowedResolved(r)
	if (c.skip != nil && c.skip(r)) || allowed {
		l.observe(r, Event{Kind: EventSkipped})
		next.ServeHTTP(w, r)
		return
	}
	cost := 1
	if c.cost != nil {
		cost = c.cost(r)
	}
	reqs := make([]store.Request, len(p.policies))
	subjects := make([]string, len(p.policies))
	kr, slot := slotted(r, resolved)
	for i := range p.policies {
		pol := &p.policies[i]
		if cost < 0 || cost > pol.limit.Burst {
			l.refuseUnrated(w, r, next, fmt.Errorf("%w: %s: cost %d outside [0, %d]", ErrCostOutOfRange, pol.name, cost, pol.limit.Burst))
			return
		}
		subject, err := pol.key(kr)
		if err == nil && subject == "" {
			err = fmt.Errorf("%w: the KeyFunc returned an empty key", keyfuncs.ErrNoKey)
		}
		if err != nil && !resolved && c.allowedAt(r, *slot) { // an allow-listed client needs no key
			l.observe(r, Event{Kind: EventSkipped})
			next.ServeHTTP(w, r)
			return
		}
		if err != nil {
			l.refuseUnrated(w, r, next, fmt.Errorf("middleware: %s: key: %w", pol.name, err))
			return
		}
		if c.allowKeys != nil && c.allowKeys[subject] {
			l.observe(r, Event{Kind: EventSkipped, Key: subject})
			next.ServeHTTP(w, r)
			return
		}
		subjects[i] = subject
		reqs[i] = store.Request{Key: pol.prefix + subject + "}", Limit: pol.limit, Cost: cost}
	}
	if !resolved && c.allowedAt(r, *slot) {
		l.observe(r, Event{Kind: EventSkipped, Key: subjects[0]})
		next.ServeHTTP(w, r)
		return
	}

	var start time.Time // read only for the Observer, as a Limiter does
	if c.observer != nil {
		start = time.Now()
	}
	res, err := m.takeAll(r.Context(), reqs)
	var latency time.Duration
	if c.observer != nil {
		latency = time.Since(start)
	}
	local := false
	if err != nil {
		if gone(r.Context()) {
			return // the client went away
		}
		l.storeErrors.Add(1)
		err = fmt.Errorf("middleware: %s: %w", c.name, err)
		l.reportConfig(err)
		for i := range p.policies {
			m.observe(r, &p.policies[i], Event{Kind: EventError, Key: subjects[i], Cost: cost, Latency: latency, Err: err})
			m.observe(r, &p.policies[i], Event{Kind: EventFallback, Key: subjects[i], Cost: cost, Policy: c.policy, Err: err, DryRun: c.dryRun})
		}
		switch {
		case c.policy.kind == failClosed && !c.dryRun:
			l.refuseFailed(w)
			return
		case c.policy.kind == failLocal && l.local != nil:
			res, err = m.localStore().TakeAll(r.Context(), m.localRequests(p, reqs))
			local = true
		}
		if err != nil { // FailOpen, or a cost a local share cannot hold
			next.ServeHTTP(w, r)
			return
		}
	} else if l.local != nil && reqs[0].Cost > 0 && !slices.ContainsFunc(res, func(r store.Result) bool { return !r.Allowed }) {
		// As a Limiter's: the local buckets follow what this server let
		// through, so that an outage starts from them.
		m.localStore().TakeAll(r.Context(), m.localRequests(p, reqs))
	}
	m.respond(w, r, next, p, reqs, subjects, res, latency, local)
}

// localRequests is reqs under the policies' local shares, for FailLocal.
func (m *Multi) localRequests(p *plan, reqs []store.Request) []store.Request {
	local := slices.Clone(reqs)
	for i := range local {
		local[i].Limit = p.policies[i].local
	}
	return local
}

// localStore is the in-process store of FailLocal.
func (m *Multi) localStore() *store.Memory { return m.base.local }

// takeAll asks the store through the breaker and within the budget.
func (m *Multi) takeAll(ctx context.Context, reqs []store.Request) ([]store.Result, error) {
	l := m.base
	call, probe := true, false
	if l.brk != nil {
		if call, probe = l.brk.allow(); !call {
			return nil, ErrBreakerOpen
		}
	}
	tctx := ctx
	if l.bound {
		var cancel context.CancelFunc
		tctx, cancel = context.WithTimeout(ctx, l.cfg.timeout)
		defer cancel()
	}
	if l.brk == nil {
		return m.ms.TakeAll(tctx, reqs)
	}
	var res []store.Result
	var err error
	l.brk.call(ctx, probe, func() error {
		res, err = m.ms.TakeAll(tctx, reqs)
		return err
	})
	return res, err
}

func (m *Multi) observe(r *http.Request, p *policy, e Event) {
	if o := m.base.cfg.observer; o != nil {
		e.Limiter, e.Request, e.KeyClass = p.event, r, KeyClass(e.Key)
		if e.Key == "" {
			e.KeyClass = "none"
		}
		o.Observe(e)
	}
}

func (m *Multi) respond(w http.ResponseWriter, r *http.Request, next http.Handler, p *plan, reqs []store.Request,
	subjects []string, res []store.Result, latency time.Duration, local bool) {
	l := m.base
	c := &l.cfg
	allowed := true
	for i := range res {
		allowed = allowed && res[i].Allowed
	}
	var now time.Time
	if c.profile&headers.XRateLimitEpoch != 0 {
		now = time.Now()
	}
	h := w.Header()
	writeHeaders := c.profile != 0 && !c.dryRun // as a Limiter: none in dry-run mode
	var retry time.Duration
	violated := -1
	for i := range p.policies {
		pol := &p.policies[i]
		q := headers.Quota{Name: pol.name, Limit: res[i].Limit.Burst, Rate: res[i].Limit.Rate, Window: res[i].Limit.Period,
			Remaining: res[i].Remaining, Reset: NextToken(res[i])}
		if writeHeaders {
			headers.Write(h, c.profile, q, now)
		}
		kind := EventAllowed
		if !allowed {
			kind = EventDenied
		}
		m.observe(r, pol, Event{Kind: kind, Key: subjects[i], Cost: reqs[i].Cost, Latency: latency,
			Result: res[i], Local: local, DryRun: c.dryRun})
		if !allowed && res[i].RetryAfter > retry {
			retry, violated = res[i].RetryAfter, i
		}
	}
	if allowed || c.dryRun {
		if allowed && c.refund != nil && !local && reqs[0].Cost > 0 {
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			if c.refund(r, sw.code()) {
				m.refund(r, reqs)
			}
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	headers.WriteRetryAfter(h, retry)
	if c.denied != nil {
		h["Cache-Control"] = []string{"no-store"}
		c.denied(w, r, res[max(violated, 0)])
		return
	}
	l.writeDeniedAs(w, h, p.policies[max(violated, 0)].problem)
}

// refund gives every policy's tokens back, one call per policy.
func (m *Multi) refund(r *http.Request, reqs []store.Request) {
	l := m.base
	if l.BreakerState() == BreakerOpen {
		l.refundFailed(r, reqs[0].Cost, ErrBreakerOpen)
		return
	}
	refunder := l.store.(store.Refunder) // checked by New
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), l.cfg.timeout)
	defer cancel()
	for _, q := range reqs {
		if _, err := refunder.Refund(ctx, q.Key, q.Limit, q.Cost); err != nil {
			l.refundFailed(r, q.Cost, err)
		}
	}
}
