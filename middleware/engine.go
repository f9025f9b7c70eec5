package middleware

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// A plan is the policies one request is decided under, all or nothing.
type plan struct {
	policies []policy
	peer     bool // every policy keys by the TCP peer (the default key)
}

// A policy is one limit of a plan and how its buckets are named.
type policy struct {
	name    string // in the headers and problem documents
	event   string // in events: "<tier>/<name>", or name
	limit   store.Limit
	local   store.Limit      // FailLocal's share
	key     keyfuncs.KeyFunc // nil: the TCP peer, appended without a string
	prefix  string           // "[<tier>/]<name>:", and "{" if tagged
	tagged  bool             // a Multi's: the subject in braces (see appendSubject)
	hdr     *fieldCache      // nil: no rate-limit headers
	problem []byte           // the problem document of a refusal, with WithProblemDetails
}

// request is one request's decision, pooled: its slices escape through events.
type request struct {
	p        *plan
	cost     int
	key      []byte   // the policies' store keys, one after another
	bounds   []int    // policy i's is key[bounds[i]:bounds[i+1]]
	subjects []string // "" for the TCP peer when nothing reads it
	res      []store.Result
	latency  time.Duration
	delay    time.Duration // how long it waits for its tokens (see wait)
	local    bool          // decided in process (deny cache, FailLocal)
	failed   bool          // the store failed: the failure policy decided
	late     bool          // admitted to wait, refused for the server's deadline
	at       time.Time     // when decided: a quota's count goes back only in its window
}

var requests = sync.Pool{New: func() any { return &request{key: make([]byte, 0, 128)} }}

const maxPooledKey = 1024 // the largest key buffer kept in the pool

func newRequest(p *plan) *request {
	q := requests.Get().(*request)
	q.p, q.cost, q.latency, q.delay, q.local, q.failed, q.late = p, 1, 0, 0, false, false, false
	q.key, q.bounds, q.subjects, q.res = q.key[:0], append(q.bounds[:0], 0), q.subjects[:0], q.res[:0]
	return q
}

func (q *request) release() {
	if cap(q.key) <= maxPooledKey {
		clear(q.subjects)
		q.p = nil
		requests.Put(q)
	}
}

func (q *request) keyOf(i int) []byte { return q.key[q.bounds[i]:q.bounds[i+1]] }

func (q *request) subject(i int) []byte {
	k, pol := q.keyOf(i), &q.p.policies[i]
	if pol.tagged {
		k = k[:len(k)-1]
	}
	return k[len(pol.prefix):]
}

// refunds reports whether WithRefund may give q's tokens back to the store.
func (q *request) refunds(c *config) bool { return c.refund != nil && q.cost > 0 && !q.failed }

// own reports whether policy i keys by the first one's subject, the penalty's.
func (q *request) own(i int) bool {
	return i == 0 || bytes.Equal(q.subject(i), q.subject(0))
}

func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	c, p := &l.cfg, l.def
	if l.of != nil {
		if t, ok := l.plans[l.of(r)]; ok {
			p = t
		}
	}
	allowed, known := c.allowedResolved(r)
	if !known && p.peer { // the default key: the peer
		allowed, known = c.allowedAddr(peerAddr(r)), true
	}
	if (c.skip != nil && c.skip(r)) || allowed {
		l.pass(w, r, next, "")
		return
	}
	q := newRequest(p)
	defer q.release()
	kr, slot := r, (*netip.Addr)(nil)
	if !known { // the key functions record the address they resolve
		slot = new(netip.Addr)
		kr = r.WithContext(keyfuncs.WithAddressSlot(r.Context(), slot))
	}
	var err error
	for i := range p.policies {
		var subject string
		q.key, subject, err = p.policies[i].appendKey(q.key, kr)
		q.bounds, q.subjects = append(q.bounds, len(q.key)), append(q.subjects, subject)
		if err != nil {
			break
		}
	}
	if !known {
		a := *slot
		if !a.IsValid() {
			a = peerAddr(r)
		}
		if c.allowedAddr(a) {
			l.pass(w, r, next, q.subjects[0])
			return
		}
	}
	if err != nil {
		l.refuseUnrated(w, r, next, fmt.Errorf("middleware: %s: key: %w", p.policies[len(q.subjects)-1].name, err))
		return
	}
	for i := range p.policies {
		if q.subjects[i] == "" && (c.observer != nil || c.allowKeys != nil) {
			q.subjects[i] = string(q.subject(i)) // the peer's address
		}
		if c.allowKeys[q.subjects[i]] { // as a skip rule: before the cost
			l.pass(w, r, next, q.subjects[i])
			return
		}
	}
	if c.cost != nil {
		q.cost = c.cost(r)
	}
	for i := range p.policies {
		if pol := &p.policies[i]; q.cost < 0 || q.cost > pol.limit.Burst {
			l.refuseUnrated(w, r, next, fmt.Errorf("%w: %s: cost %d outside [0, %d]", ErrCostOutOfRange, pol.name, q.cost, pol.limit.Burst))
			return
		}
	}
	if c.observer != nil || c.refund != nil {
		q.at = time.Now()
	}
	err = l.decide(r.Context(), q)
	if c.observer != nil {
		q.latency = time.Since(q.at)
	}
	if err != nil && !l.fallBack(w, r, next, q, err) {
		return
	}
	if l.local != nil && q.cost > 0 && !q.local && allAllowed(q.res) {
		// No fresh burst per outage: 0.1-0.5 µs, against tens of µs for Redis.
		l.take(r.Context(), q, true, true)
	}
	if !q.local && !l.wait(r, q) {
		return // the client went away while it waited: its tokens are back
	}
	l.respond(w, r, next, q)
}

// pass serves a request that skip rules or the allow-list let through.
func (l *Limiter) pass(w http.ResponseWriter, r *http.Request, next http.Handler, key string) {
	l.observe(r, l.cfg.name, Event{Kind: EventSkipped, Key: key})
	next.ServeHTTP(w, r)
}

// fallBack applies the failure policy to err: true if q was decided locally, false if answered.
func (l *Limiter) fallBack(w http.ResponseWriter, r *http.Request, next http.Handler, q *request, err error) bool {
	c := &l.cfg
	if gone(r.Context()) { // not the store's fault: a client that left reads nothing, a deadline set here a 503
		if c.dryRun {
			next.ServeHTTP(w, r)
		} else {
			writeRefusal(w, http.StatusServiceUnavailable, true, textPlain, goneBody)
		}
		return false
	}
	l.storeErrors.Add(1)
	err = fmt.Errorf("middleware: %s: %w", c.name, err)
	if scriptRefused(err) { // no retry cures it
		l.configOnce.Do(func() {
			slog.Error("tollgate: the store cannot run its script; the failure policy decides every request "+
				"until this is fixed (store.Redis.Check names what to grant)", "limiter", c.name, "error", err)
		})
	}
	for i := range q.p.policies {
		l.report(r, q, i, Event{Kind: EventError, Latency: q.latency, Err: err})
		l.report(r, q, i, Event{Kind: EventFallback, Policy: c.policy, Err: err, DryRun: c.dryRun})
	}
	switch {
	case c.policy.kind == failClosed && !c.dryRun:
		p := c.policy
		if p.retryAfter > 0 {
			headers.WriteRetryAfter(w.Header(), p.retryAfter)
		}
		writeRefusal(w, p.status, true, textPlain, []byte(strconv.Itoa(p.status)+" "+http.StatusText(p.status)+": rate limiter unavailable\n"))
		return false
	case l.local != nil: // FailLocal
		q.local, q.failed = true, true
		if l.take(r.Context(), q, true, false) == nil {
			return true
		}
	}
	next.ServeHTTP(w, r) // unlimited
	return false
}

func allAllowed(res []store.Result) bool {
	return !slices.ContainsFunc(res, func(r store.Result) bool { return !r.Allowed })
}

// appendKey appends pol's store key of r to b and returns r's subject ("" for the peer).
func (pol *policy) appendKey(b []byte, r *http.Request) ([]byte, string, error) {
	if pol.key == nil {
		b, err := keyfuncs.AppendPeerIP(append(b, pol.prefix...), r)
		if pol.tagged {
			b = append(b, '}')
		}
		return b, "", err
	}
	subject, err := pol.key(r)
	if err == nil && subject == "" {
		err = fmt.Errorf("%w: the KeyFunc returned an empty key", keyfuncs.ErrNoKey)
	}
	return pol.appendSubject(b, subject), subject, err
}

// appendSubject appends subject's store key to b: "<name>:<subject>", "{<name>:<subject>}" if the
// subject has a brace (which then picks no Cluster slot), or a Multi's "<name>:{<subject>}".
func (pol *policy) appendSubject(b []byte, subject string) []byte {
	braced := !pol.tagged && strings.IndexByte(subject, '{') >= 0
	if braced {
		b = append(b, '{')
	}
	b = append(append(b, pol.prefix...), subject...)
	if braced || pol.tagged {
		b = append(b, '}')
	}
	return b
}

// decide puts in q.res the deny cache's refusal, else the store's answer.
func (l *Limiter) decide(ctx context.Context, q *request) error {
	key, lim := q.keyOf(0), q.p.policies[0].limit
	deny := l.deny != nil && q.cost > 0 && lim.Window == nil // one-policy plans, not reads or window quotas
	var verdict denyVerdict
	var gen uint64
	var res store.Result // zero unless the cache or the store answered
	if deny {
		if verdict, res, gen = l.deny.check(key, lim, q.cost); verdict == denyHit {
			l.denyHits.Add(1)
			q.res, q.local = append(q.res, res), true
			return nil
		}
	}
	err := l.call(ctx, func(ctx context.Context) error { return l.take(ctx, q, false, false) })
	if !deny {
		return err
	}
	if err == nil {
		res = q.res[0]
	}
	switch {
	case err == nil && !res.Allowed:
		l.deny.denied(key, lim, q.cost, res)
	case verdict != denyProbe:
	case err == nil && res.Remaining < q.cost:
		// The bucket holds cost again at ResetAfter - (Burst-cost)*T, less 1 µs of rounding.
		if wait := res.ResetAfter - tokenTime(lim, lim.Burst-q.cost, true) - time.Microsecond - l.cfg.delay; wait > 0 {
			l.deny.denied(key, lim, q.cost, store.Result{RetryAfter: wait, ResetAfter: res.ResetAfter})
			break
		}
		l.deny.probed(key, gen)
	default: // allowed with room left, or no answer: ask the store again
		l.deny.probed(key, gen)
	}
	return err
}

// call runs fn through the breaker within the budget (neither for a Memory).
func (l *Limiter) call(ctx context.Context, fn func(context.Context) error) error {
	if l.brk == nil {
		return fn(ctx)
	}
	ok, probe := l.brk.allow()
	if !ok {
		return ErrBreakerOpen
	}
	return l.brk.call(ctx, probe, func() error { return fn(l.budget.Context(ctx)) })
}

// take decides q on the store, or FailLocal's under the local shares, into q.res unless mirror; a
// fallback never waits. A sweep is a goroutine that ends with it: a Limiter has no Close.
func (l *Limiter) take(ctx context.Context, q *request, local, mirror bool) error {
	s, delay := l.store, l.cfg.delay
	if local {
		if now, last := int64(monotonicNow()), l.localSwept.Load(); now-last >= int64(localSweep) && l.localSwept.CompareAndSwap(last, now) {
			go l.local.Sweep()
		}
		s = l.local
		if !mirror {
			delay = 0
		}
	}
	pols := q.p.policies
	if len(pols) > 1 {
		reqs := make([]store.Request, len(pols))
		for i := range reqs {
			reqs[i] = store.Request{Key: string(q.keyOf(i)), Limit: pols[i].limit, Cost: q.cost, MaxDelay: delay}
			if local {
				reqs[i].Limit, reqs[i].Cost = pols[i].share(q.cost, mirror)
			}
		}
		res, err := s.(store.MultiStore).TakeAll(ctx, reqs)
		if local {
			for i := range res {
				res[i].Limit = pols[i].local // the share, not a burst widened for a cost
			}
		}
		if !mirror {
			q.res = res
		}
		return err
	}
	key, lim, cost := q.keyOf(0), pols[0].limit, q.cost
	if local {
		lim, cost = pols[0].share(cost, mirror)
	}
	var res store.Result
	var err error
	switch m, ok := s.(*store.Memory); {
	case delay > 0:
		res, err = s.(store.Delayer).TakeDelayed(ctx, string(key), lim, cost, delay)
	case ok: // reads the key's bytes, which the caller reuses after
		res, err = m.TakeBytes(ctx, key, lim, cost)
	default: // a copy: Redis hands its key to a client that can outlive the call
		res, err = s.Take(ctx, string(key), lim, cost)
	}
	if local {
		res.Limit = pols[0].local
	}
	if !mirror {
		q.res = append(q.res[:0], res)
	}
	return err
}

// share returns the local share and cost of a request of cost under pol: a cost over a bucket's
// burst is taken whole from a full one (its debt then carries all of it, at the share's rate); a
// mirror takes what there is, and a window quota's share all of its count (once per window).
func (pol *policy) share(cost int, mirror bool) (store.Limit, int) {
	if s := pol.local; cost > s.Burst && s.Window == nil && !mirror {
		s.Burst = cost
		return s, cost
	}
	return pol.local, min(cost, pol.local.Burst)
}

// wait holds an allowed request until its tokens are due (WithDelay), else gives them back: refused
// until due if its deadline comes first, false if its client went away.
func (l *Limiter) wait(r *http.Request, q *request) bool {
	for i := range q.res { // the policies' longest Delay
		if q.res[i].Allowed {
			q.delay = max(q.delay, q.res[i].Delay)
		}
	}
	d := q.delay
	if d <= 0 || l.cfg.dryRun {
		return true
	}
	ctx, left, late := r.Context(), d, true
	if deadline, ok := ctx.Deadline(); !ok || time.Until(deadline) >= d {
		start, t := time.Now(), time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			for i := range q.res {
				q.res[i] = aged(q.res[i], d)
			}
			return true
		case <-ctx.Done():
			left, late = d-time.Since(start), errors.Is(ctx.Err(), context.DeadlineExceeded)
		}
	}
	l.giveBack(r, q, false)
	if !late {
		for i := range q.p.policies {
			l.report(r, q, i, Event{Kind: EventAbandoned, Latency: q.latency, Result: q.res[i], Delay: d})
		}
		return false
	}
	for i, res := range q.res { // a refusal, of the bucket without its tokens
		res = aged(res, tokenTime(res.Limit, q.cost, false))
		res.Allowed, res.RetryAfter, res.Delay = false, max(left, time.Microsecond), 0
		q.res[i] = res
	}
	q.late = true
	return true
}

// aged returns res as it stands d later if nothing else takes from it.
func aged(res store.Result, d time.Duration) store.Result {
	res.ResetAfter = max(res.ResetAfter-d, 0)
	res.Remaining = tokensAt(res.Limit, res.ResetAfter)
	return res
}

// observe sends e, of the limiter or policy named name, to the observer.
func (l *Limiter) observe(r *http.Request, name string, e Event) {
	if o := l.cfg.observer; o != nil {
		e.Limiter, e.Request, e.KeyClass = name, r, KeyClass(e.Key)
		if e.Key == "" {
			e.KeyClass = "none"
		}
		o.Observe(e)
	}
}

// report sends e, an event of policy i of q, to the observer.
func (l *Limiter) report(r *http.Request, q *request, i int, e Event) {
	e.Key, e.Cost = q.subjects[i], q.cost
	l.observe(r, q.p.policies[i].event, e)
}

// respond reports q, writes its headers and serves or refuses the request (for the policy freeing last).
func (l *Limiter) respond(w http.ResponseWriter, r *http.Request, next http.Handler, q *request) {
	c, pols := &l.cfg, q.p.policies
	allowed := allAllowed(q.res)
	refused := !allowed && !c.dryRun
	if refused && c.penalty != nil && !q.failed && !q.late && q.refusedOwn() && !slices.ContainsFunc(q.res, l.inBlock) {
		l.strike(r, q) // first: a block it lands is what the events and headers report
	}
	kind, delay := EventDenied, time.Duration(0)
	if allowed {
		kind, delay = EventAllowed, q.delay
	}
	var now time.Time // read only where a header needs the wall clock
	if c.profile&headers.XRateLimitEpoch != 0 {
		now = time.Now()
	}
	h, violated := w.Header(), 0
	for i := range pols {
		pol := &pols[i]
		if c.observer != nil {
			l.report(r, q, i, Event{Kind: kind, Latency: q.latency, Result: q.res[i], Local: q.local, DryRun: c.dryRun, Delay: delay})
		}
		if q.res[i].RetryAfter > q.res[violated].RetryAfter {
			violated = i
		}
		switch {
		case pol.hdr == nil: // no headers, or dry-run mode
		case refused && len(pols) == 1:
			pol.hdr.writeDenied(h, pol.quota(q.res[0]), q.res[0].RetryAfter, now)
		default:
			pol.hdr.write(h, pol.quota(q.res[i]), now)
		}
	}
	switch {
	case allowed && (q.refunds(c) || c.penalty != nil && c.penalty.Failed != nil):
		l.serveWatched(w, r, next, q)
	case !refused:
		next.ServeHTTP(w, r)
	default:
		if len(pols) > 1 || pols[0].hdr == nil {
			headers.WriteRetryAfter(h, q.res[violated].RetryAfter)
		}
		if c.denied != nil {
			h["Cache-Control"] = []string{"no-store"} // the canonical key Header.Set would compute
			c.denied(w, r, q.res[violated])
			return
		}
		body, ctype := deniedBody, textPlain
		if p := pols[violated].problem; p != nil {
			body, ctype = p, "application/problem+json"
		}
		writeRefusal(w, http.StatusTooManyRequests, true, ctype, body)
	}
}

// quota turns pol's store result into what the headers report.
func (pol *policy) quota(res store.Result) headers.Quota {
	window := res.Limit.Period
	// Only a calendar window's length varies: 4 allocations fewer for the others.
	if w := res.Limit.Window; w != nil && (w.Location() != nil || res.Limit.Period == 0) {
		start, end := res.Limit.WindowAt(time.Now())
		window = end.Sub(start)
	}
	return headers.Quota{Name: pol.name, Limit: res.Limit.Burst, Rate: res.Limit.Rate, Window: window,
		Remaining: res.Remaining, Reset: NextToken(res)} // Limit: the local share under FailLocal
}

// newPolicy returns p's policy in tier, named by p if tagged (a Multi's), else by the options.
func (l *Limiter) newPolicy(tier string, p Policy, tagged bool) (policy, error) {
	c, limit, name, key := &l.cfg, p.Limit, l.cfg.name, p.Key
	if key == nil {
		key = c.keyFunc
	}
	if tagged {
		if err := limit.Validate(); err != nil {
			return policy{}, fmt.Errorf("middleware: tier %q: %w", tier, err)
		}
		name = cmp.Or(p.Name, DefaultName(limit)+"@"+l.site)
		if checkName("", name) != nil || strings.Contains(name, "/") {
			return policy{}, fmt.Errorf("middleware: tier %q: policy %q: printable ASCII without '{', '}', ':' or '/'", tier, name)
		}
	}
	for opt, on := range map[string]bool{"WithDelay": c.delay > 0, "WithPenalty": c.penalty != nil} {
		if on && limit.Window != nil {
			return policy{}, fmt.Errorf("middleware: %s: policy %q is a window quota (%v), not a token bucket", opt, name, limit)
		}
	}
	if err := limit.ValidateDelay(c.delay); err != nil {
		return policy{}, fmt.Errorf("middleware: WithDelay: %w", err)
	}
	if p := c.penalty; p != nil {
		// A strike finds up to a whole bucket and the queue in debt.
		if err := limit.ValidateBlock(p.Block + 2*c.delay + tokenTime(limit, limit.Burst, true)); err != nil {
			return policy{}, fmt.Errorf("middleware: WithPenalty: %w", err)
		}
	}
	pol := policy{name: name, event: name, limit: limit, key: key, prefix: name + ":", tagged: tagged}
	if tagged {
		pol.prefix += "{"
	}
	if tier != "" {
		pol.event, pol.prefix = tier+"/"+name, tier+"/"+pol.prefix
	}
	if c.problemDetails {
		pol.problem = problemDocument(name)
	}
	if c.profile != 0 && !c.dryRun {
		pol.hdr = newFieldCache(c.profile, name, limit)
	}
	if l.local != nil {
		// The rate over n periods; a window quota's, 1/n of its count.
		n := c.policy.replicas
		pol.local = store.Limit{Rate: limit.Rate, Period: limit.Period * time.Duration(n), Burst: max(1, limit.Burst/n)}
		if limit.Window != nil {
			share := max(1, limit.Rate/n)
			pol.local = store.Limit{Rate: share, Period: limit.Period, Burst: share, Window: limit.Window}
		}
		widest, _ := pol.share(limit.Burst, false) // of a cost of Burst
		if err := cmp.Or(pol.local.ValidateDelay(c.delay), widest.Validate()); err != nil {
			return policy{}, fmt.Errorf("middleware: FailLocalShare(%d): %w", n, err)
		}
	}
	return pol, nil
}

// serveWatched serves the request, then refunds it or counts a strike as WithRefund and Failed say.
func (l *Limiter) serveWatched(w http.ResponseWriter, r *http.Request, next http.Handler, q *request) {
	sw := &statusWriter{ResponseWriter: w}
	defer func() { // after a panic too, as the 500 a Recoverer writes; the panic goes on
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				l.settle(r, q, cmp.Or(sw.status, http.StatusInternalServerError))
			}
			panic(v)
		}
	}()
	next.ServeHTTP(sw, r)
	l.settle(r, q, cmp.Or(sw.status, http.StatusOK))
}

// settle gives back or strikes q by the status code of its response.
func (l *Limiter) settle(r *http.Request, q *request, code int) {
	refund := q.refunds(&l.cfg) && l.cfg.refund(r, code)
	p := l.cfg.penalty
	strike := p != nil && p.Failed != nil && !l.cfg.dryRun && !q.failed && p.Failed(r, code)
	blocked := false // blocked meanwhile: no strike, and no tokens back into the block
	if p != nil && (refund || strike) {
		var res store.Result
		err := l.call(context.WithoutCancel(r.Context()), func(ctx context.Context) (err error) {
			res, err = store.Inspect(ctx, l.store, string(q.keyOf(0)), q.p.policies[0].limit, q.cost)
			return err
		})
		blocked = err == nil && l.inBlock(res)
	}
	if refund {
		l.giveBack(r, q, blocked)
	}
	if strike && !blocked {
		l.strike(r, q)
	}
}

// refusedOwn reports whether one of the subject's own policies refused q.
func (q *request) refusedOwn() bool {
	for i := range q.res {
		if q.own(i) && q.res[i].RetryAfter > 0 {
			return true
		}
	}
	return false
}

// inBlock reports whether res's bucket is further from full than a burst, the queue and rounding allow.
func (l *Limiter) inBlock(res store.Result) bool {
	return res.Limit.Window == nil && // a window quota is never blocked
		res.ResetAfter > tokenTime(res.Limit, res.Limit.Burst, true)+time.Microsecond+l.cfg.delay
}

// strike counts a strike against q's subject in the bucket "}<store key>" ('}' begins no key); the
// last blocks the subject's own buckets not yet blocked, puts their state in q.res, forgives the strikes.
func (l *Limiter) strike(r *http.Request, q *request) {
	p, d, admin := l.cfg.penalty, l.cfg.delay, l.store.(store.Admin) // checked by New
	strikes, ctx := "}"+string(q.keyOf(0)), context.WithoutCancel(r.Context())
	var res store.Result
	err := l.call(ctx, func(ctx context.Context) (err error) {
		res, err = l.store.Take(ctx, strikes, p.strikes(), 1)
		return err
	})
	if err == nil && (!res.Allowed || res.Remaining > 0) {
		return // strikes left, or none: another request spent the last one
	}
	if err == nil {
		err = l.call(ctx, func(ctx context.Context) error {
			for i := range q.p.policies {
				if !q.own(i) {
					continue
				}
				key, pol := string(q.keyOf(i)), &q.p.policies[i]
				res, err := store.Inspect(ctx, l.store, key, pol.limit, q.cost)
				if err == nil && !l.inBlock(res) {
					if err = admin.Block(ctx, key, pol.limit, p.Block+d); err == nil { // d: the queue
						if l.local != nil { // should the store fail in the block
							l.local.Block(ctx, key, pol.local, p.Block+d)
						}
						res, err = store.Inspect(ctx, l.store, key, pol.limit, q.cost)
					}
				}
				if err != nil {
					return err
				}
				if !res.Allowed { // queued from then on
					res.RetryAfter = max(res.RetryAfter-d, time.Microsecond)
				}
				q.res[i] = res
			}
			return admin.Reset(ctx, strikes)
		})
	}
	switch {
	case err == nil && l.deny != nil:
		l.deny.denied(q.keyOf(0), q.p.policies[0].limit, q.cost, q.res[0])
	case err != nil && !errors.Is(err, ErrBreakerOpen): // reported when it opened
		l.storeErrors.Add(1)
		l.report(r, q, 0, Event{Kind: EventError, Err: fmt.Errorf("middleware: %s: penalty: %w", l.cfg.name, err)})
	}
}

// giveBack refunds q's buckets (bar the subject's own if notOwn) within the budget, client gone or not.
func (l *Limiter) giveBack(r *http.Request, q *request, notOwn bool) {
	failed := func(err error) {
		l.observe(r, l.cfg.name, Event{Kind: EventError, Cost: q.cost, Err: fmt.Errorf("middleware: %s: refund: %w", l.cfg.name, err)})
	}
	if l.BreakerState() == BreakerOpen {
		failed(ErrBreakerOpen) // no waiting on a store known to fail
		return
	}
	ctx := l.budget.Context(context.WithoutCancel(r.Context()))
	for i := range q.p.policies {
		pol := &q.p.policies[i]
		if lim := pol.limit; lim.Window != nil {
			took, _ := lim.WindowAt(q.at)
			if start, _ := lim.WindowAt(time.Now()); !took.Equal(start) { // read just before its refund
				continue // its window has ended: a count back in the next would loosen it
			}
		}
		if notOwn && q.own(i) {
			continue
		}
		key := string(q.keyOf(i))
		if l.local != nil && !q.local { // the mirror took them too, at most a share's burst
			l.local.Refund(ctx, key, pol.local, min(q.cost, pol.local.Burst))
		}
		if _, err := l.store.(store.Refunder).Refund(ctx, key, pol.limit, q.cost); err != nil { // checked by New
			failed(err)
		} else if l.deny != nil { // a denial cached meanwhile
			l.deny.probed(q.keyOf(i), 0)
		}
	}
}
