package middleware

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// The one request path of [Limiter] and [Multi]: a Limiter is a plan of one
// policy, a Multi has plans of several. skip → key → cost → deny cache →
// store under the budget → failure policy → headers → next or 429 → refund.

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
	prefix  string           // "<name>:", or "[<tier>/]<name>:{" if tagged
	tagged  bool             // a Multi's: the subject in braces, the Cluster hash tag of its policies
	hdr     *fieldCache      // nil: no rate-limit headers
	problem []byte           // the problem document of a refusal, with WithProblemDetails
}

// request is what one request's decision needs, pooled, so that a plan of
// one policy allocates nothing (on the stack, the slices of one policy
// would escape through the Observer's strings).
type request struct {
	p        *plan
	cost     int
	key      []byte   // the policies' store keys, one after another
	ends     []int    // where each key ends in key
	subjects []string // "" for the TCP peer when nothing reads it
	res      []store.Result
	refund   []string // the store keys, kept past the request, for WithRefund
	latency  time.Duration
	local    bool      // decided in process (deny cache, FailLocal)
	failed   bool      // the store failed: the failure policy decided
	late     bool      // admitted to wait, refused for the server's deadline
	at       time.Time // when decided, for WithRefund: a quota's count goes back only in its window
}

var requests = sync.Pool{New: func() any { return &request{key: make([]byte, 0, 128)} }}

// maxPooledKey bounds the key buffers kept in the pool: a request that grew
// one for a huge key is dropped rather than kept.
const maxPooledKey = 1024

func newRequest(p *plan) *request {
	q := requests.Get().(*request)
	q.p, q.cost, q.latency, q.local, q.failed, q.late = p, 1, 0, false, false, false
	q.key, q.ends, q.subjects, q.res, q.refund = q.key[:0], q.ends[:0], q.subjects[:0], q.res[:0], q.refund[:0]
	return q
}

func (q *request) release() {
	if cap(q.key) <= maxPooledKey {
		clear(q.subjects)
		clear(q.refund)
		q.p = nil
		requests.Put(q)
	}
}

// keyOf returns the store key of policy i.
func (q *request) keyOf(i int) []byte {
	start := 0
	if i > 0 {
		start = q.ends[i-1]
	}
	return q.key[start:q.ends[i]]
}

func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	c := &l.cfg
	p := l.def
	if l.of != nil {
		if t, ok := l.plans[l.of(r)]; ok {
			p = t
		}
	}
	allowed, resolved := c.allowedResolved(r)
	if !resolved && p.peer {
		allowed, resolved = c.allowedPeer(r), true // the default key: the peer
	}
	if (c.skip != nil && c.skip(r)) || allowed {
		l.observe(r, c.name, Event{Kind: EventSkipped})
		next.ServeHTTP(w, r)
		return
	}
	q := newRequest(p)
	defer q.release()
	kr, slot := slotted(r, resolved)
	var err error
	for i := range p.policies {
		var subject string
		q.key, subject, err = l.appendKey(q.key, &p.policies[i], kr)
		q.ends, q.subjects = append(q.ends, len(q.key)), append(q.subjects, subject)
		if err != nil {
			break
		}
	}
	if !resolved && c.allowedAt(r, *slot) { // an allow-listed client needs no key
		l.observe(r, c.name, Event{Kind: EventSkipped, Key: q.subjects[0]})
		next.ServeHTTP(w, r)
		return
	}
	if err != nil {
		l.refuseUnrated(w, r, next, fmt.Errorf("middleware: %s: key: %w", p.policies[len(q.ends)-1].name, err))
		return
	}
	if c.cost != nil {
		q.cost = c.cost(r)
	}
	for i := range p.policies {
		pol := &p.policies[i]
		if q.cost < 0 || q.cost > pol.limit.Burst {
			l.refuseUnrated(w, r, next, fmt.Errorf("%w: %s: cost %d outside [0, %d]", ErrCostOutOfRange, pol.name, q.cost, pol.limit.Burst))
			return
		}
		if q.subjects[i] == "" && l.hooks {
			key := q.keyOf(i)
			if pol.tagged {
				key = key[:len(key)-1]
			}
			q.subjects[i] = string(key[len(pol.prefix):]) // the peer's address
		}
		if c.allowKeys != nil && c.allowKeys[q.subjects[i]] {
			l.observe(r, c.name, Event{Kind: EventSkipped, Key: q.subjects[i]})
			next.ServeHTTP(w, r)
			return
		}
	}
	if c.refund != nil && q.cost > 0 {
		for i := range p.policies {
			q.refund = append(q.refund, string(q.keyOf(i)))
		}
		q.at = time.Now()
	}
	var start time.Time
	if c.observer != nil {
		start = time.Now()
	}
	err = l.decide(r.Context(), q)
	if c.observer != nil {
		q.latency = time.Since(start)
	}
	if err != nil && !l.fallBack(w, r, next, q, err) {
		return
	}
	if err == nil && l.local != nil && q.cost > 0 && !q.local && allAllowed(q.res) {
		// The local buckets follow what this server let through, so that a
		// switch to FailLocal starts from them: a client that was flooding
		// gets no fresh burst per outage. (One Memory decision per allowed
		// request, 0.1-0.5 µs, against tens of µs for the Redis round trip.)
		l.takeLocal(r.Context(), q, true)
	}
	if err == nil && !q.local && !l.wait(r, q) {
		return // the client went away while it waited: its tokens are back
	}
	l.respond(w, r, next, q)
}

// fallBack handles a store error by the failure policy: it reports whether q
// was decided locally (FailLocal); if not, it has answered the request:
// refused it (FailClosed), served it unlimited (FailOpen, or a cost a local
// share cannot hold), or nothing if the client went away.
func (l *Limiter) fallBack(w http.ResponseWriter, r *http.Request, next http.Handler, q *request, err error) bool {
	c := &l.cfg
	if gone(r.Context()) {
		return false // the client went away: nobody to answer, and not the store's fault
	}
	l.storeErrors.Add(1)
	err = fmt.Errorf("middleware: %s: %w", c.name, err)
	l.reportConfig(err)
	for i := range q.p.policies {
		pol := &q.p.policies[i]
		l.observe(r, pol.event, Event{Kind: EventError, Key: q.subjects[i], Cost: q.cost, Latency: q.latency, Err: err})
		l.observe(r, pol.event, Event{Kind: EventFallback, Key: q.subjects[i], Cost: q.cost, Policy: c.policy, Err: err, DryRun: c.dryRun})
	}
	switch {
	case c.policy.kind == failClosed && !c.dryRun:
		l.refuseFailed(w)
		return false
	case c.policy.kind == failLocal && l.local != nil:
		q.local, q.failed, q.refund = true, true, nil // nothing to give back to the store
		if l.takeLocal(r.Context(), q, false) == nil {
			return true
		}
	}
	next.ServeHTTP(w, r) // unlimited, no rate-limit headers
	return false
}

// allAllowed reports whether every result allows the request.
func allAllowed(res []store.Result) bool {
	for i := range res {
		if !res[i].Allowed {
			return false
		}
	}
	return true
}

// appendKey appends pol's store key of r to b, which the store prefixes:
// "<name>:<subject>" ("tollgate:<name>:<subject>") for a Limiter, or
// "<name>:{<subject>}" for a Multi's policy, whose braces make the subject
// the Redis Cluster hash tag (which the store hashes): the policies of one
// subject share a slot and one script call. A Limiter's subject that holds a
// brace, as the route pattern "GET /items/{id}" does, is wrapped with the
// name in braces, "{<name>:<subject>}", so that its own braces pick no slot.
// subject is "" for the TCP peer (never a brace), appended without being
// allocated.
func (l *Limiter) appendKey(b []byte, pol *policy, r *http.Request) (key []byte, subject string, err error) {
	if pol.key == nil {
		b, err = keyfuncs.AppendPeerIP(append(b, pol.prefix...), r)
		if pol.tagged {
			b = append(b, '}')
		}
		return b, "", err
	}
	subject, err = pol.key(r)
	if err == nil && subject == "" {
		err = fmt.Errorf("%w: the KeyFunc returned an empty key", keyfuncs.ErrNoKey)
	}
	switch {
	case pol.tagged:
		return append(append(append(b, pol.prefix...), subject...), '}'), subject, err
	case strings.IndexByte(subject, '{') >= 0:
		b = append(append(append(b, '{'), pol.prefix...), subject...)
		return append(b, '}'), subject, err
	}
	return append(append(b, pol.prefix...), subject...), subject, err
}

// decide puts in q.res the store's answer for every policy: for one policy
// from the deny cache if it refuses it, else through the breaker within the
// budget; for several, in one TakeAll.
func (l *Limiter) decide(ctx context.Context, q *request) error {
	if len(q.p.policies) > 1 {
		reqs := make([]store.Request, len(q.p.policies))
		for i := range reqs {
			reqs[i] = store.Request{Key: string(q.keyOf(i)), Limit: q.p.policies[i].limit, Cost: q.cost, MaxDelay: l.cfg.delay}
		}
		res, err := l.call(ctx, func(ctx context.Context) ([]store.Result, error) { return l.ms.TakeAll(ctx, reqs) })
		q.res = res
		return err
	}
	key, lim := q.keyOf(0), q.p.policies[0].limit
	var verdict denyVerdict
	var gen uint64
	// A read takes nothing: never refused locally; nor is a window quota's
	// request, whose count the cache's arithmetic of tokens does not model.
	deny := l.deny != nil && q.cost > 0 && lim.Window == nil
	if deny {
		var res store.Result
		if verdict, res, gen = l.deny.check(key, lim, q.cost); verdict == denyHit {
			l.denyHits.Add(1)
			q.res, q.local = append(q.res, res), true
			return nil
		}
	}
	res, err := l.call(ctx, func(ctx context.Context) ([]store.Result, error) {
		var res store.Result
		var err error
		switch {
		case l.delayer != nil:
			res, err = l.delayer.TakeDelayed(ctx, string(key), lim, q.cost, l.cfg.delay)
		case l.mem != nil: // reads the key's bytes, which the caller reuses after
			res, err = l.mem.TakeBytes(ctx, key, lim, q.cost)
		default: // a copy: Redis hands its key to a client that can outlive the call
			res, err = l.store.Take(ctx, string(key), lim, q.cost)
		}
		q.res = append(q.res[:0], res)
		return q.res, err
	})
	if deny {
		l.recordDenial(key, lim, q.cost, verdict, gen, res, err)
	}
	return err
}

// recordDenial tells the deny cache what the store answered for key.
func (l *Limiter) recordDenial(key []byte, lim store.Limit, cost int, verdict denyVerdict, gen uint64, res []store.Result, err error) {
	switch {
	case err == nil && !res[0].Allowed:
		l.deny.denied(key, lim, cost, res[0])
	case verdict == denyProbe && err == nil && res[0].Remaining < cost:
		// The probe took the tokens that came back and left fewer than
		// cost: the next request of this cost would be denied until the
		// bucket holds cost again, at ResetAfter - (Burst-cost)*T, which
		// the answer gives exactly (less a microsecond for its rounding).
		// Keep refusing locally until then.
		wait := res[0].ResetAfter - tokenTime(lim, lim.Burst-cost, true) - time.Microsecond - l.cfg.delay
		if wait > 0 {
			l.deny.denied(key, lim, cost, store.Result{RetryAfter: wait, ResetAfter: res[0].ResetAfter})
		} else {
			l.deny.probed(key, gen)
		}
	case verdict == denyProbe: // allowed with room left, or no answer: ask the store again
		l.deny.probed(key, gen)
	}
}

// call runs fn through the circuit breaker, within the timeout budget unless
// the store is a Memory (nothing to wait for).
func (l *Limiter) call(ctx context.Context, fn func(context.Context) ([]store.Result, error)) ([]store.Result, error) {
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
		return fn(tctx)
	}
	var res []store.Result
	var err error
	l.brk.call(ctx, probe, func() error {
		res, err = fn(tctx)
		return err
	})
	return res, err
}

// takeLocal decides q on FailLocal's in-process store, under the local
// shares, into q.res unless it only mirrors what the store allowed.
func (l *Limiter) takeLocal(ctx context.Context, q *request, mirror bool) error {
	// The local store is swept every localSweep by a goroutine that ends
	// with the sweep: a Limiter has no Close that could stop a sweeper.
	if now, last := int64(monotonicNow()), l.localSwept.Load(); now-last >= int64(localSweep) && l.localSwept.CompareAndSwap(last, now) {
		go l.local.Sweep()
	}
	delay := time.Duration(0) // a fallback never waits; a mirror follows the store
	if mirror {
		delay = l.cfg.delay
	}
	if len(q.p.policies) == 1 {
		var res store.Result
		var err error
		if delay > 0 {
			res, err = l.local.TakeDelayed(ctx, string(q.keyOf(0)), q.p.policies[0].local, q.cost, delay)
		} else {
			res, err = l.local.TakeBytes(ctx, q.keyOf(0), q.p.policies[0].local, q.cost)
		}
		if err == nil && !mirror {
			q.res = append(q.res[:0], res)
		}
		return err
	}
	reqs := make([]store.Request, len(q.p.policies))
	for i := range reqs {
		reqs[i] = store.Request{Key: string(q.keyOf(i)), Limit: q.p.policies[i].local, Cost: q.cost, MaxDelay: delay}
	}
	res, err := l.local.TakeAll(ctx, reqs)
	if err == nil && !mirror {
		q.res = res
	}
	return err
}

// wait holds an allowed request until its tokens are due (WithDelay): the
// longest Delay over its policies. A request whose context ends first (a
// deadline of the server's, before its tokens or while it waits) gets its
// tokens given back and a refusal to answer, retried when they are due; if
// the client went away it reports false: nothing to answer.
func (l *Limiter) wait(r *http.Request, q *request) bool {
	var d time.Duration
	for i := range q.res {
		if q.res[i].Allowed {
			d = max(d, q.res[i].Delay)
		}
	}
	if d <= 0 || l.cfg.dryRun {
		return true
	}
	ctx := r.Context()
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		l.refuseLate(r, q, d)
		return true
	}
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		for i := range q.res {
			q.res[i] = aged(q.res[i], d)
		}
		return true
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			l.refuseLate(r, q, d-time.Since(start))
			return true
		}
		l.giveBack(r, q, q.storeKeys())
		for i := range q.p.policies {
			l.observe(r, q.p.policies[i].event, Event{Kind: EventAbandoned, Key: q.subjects[i], Cost: q.cost,
				Latency: q.latency, Result: q.res[i], Delay: d, DryRun: l.cfg.dryRun})
		}
		return false
	}
}

// refuseLate gives back the tokens of a request that cannot wait for them
// and makes its results a refusal, to retry in d.
func (l *Limiter) refuseLate(r *http.Request, q *request, d time.Duration) {
	l.giveBack(r, q, q.storeKeys())
	for i, res := range q.res {
		res.ResetAfter -= tokenTime(res.Limit, q.cost, false) // the bucket without them
		res = aged(res, 0)
		res.Allowed, res.RetryAfter, res.Delay = false, max(d, time.Microsecond), 0
		q.res[i] = res
	}
	q.refund = q.refund[:0] // nothing more to give back
	q.late = true
}

// storeKeys returns the policies' store keys as strings, in q.refund.
func (q *request) storeKeys() []string {
	q.refund = q.refund[:0]
	for i := range q.p.policies {
		q.refund = append(q.refund, string(q.keyOf(i)))
	}
	return q.refund
}

// aged returns res as it stands d later if nothing else takes from its
// bucket: the headers of a request that waited d describe the state after it.
func aged(res store.Result, d time.Duration) store.Result {
	res.ResetAfter = max(res.ResetAfter-d, 0)
	res.Remaining = tokensAt(res.Limit, res.ResetAfter)
	return res
}

// observe sends e, from the limiter or policy named name, to the observer.
func (l *Limiter) observe(r *http.Request, name string, e Event) {
	if o := l.cfg.observer; o != nil {
		e.Limiter, e.Request, e.KeyClass = name, r, KeyClass(e.Key)
		if e.Key == "" {
			e.KeyClass = "none"
		}
		o.Observe(e)
	}
}

// respond reports the decision, writes its headers and serves or refuses
// the request. A refusal's Retry-After is the latest over the policies, and
// its problem document and denied handler those of that policy.
func (l *Limiter) respond(w http.ResponseWriter, r *http.Request, next http.Handler, q *request) {
	c := &l.cfg
	allowed := allAllowed(q.res)
	if !allowed && !c.dryRun && c.penalty != nil && !q.failed && !q.late && q.refusedOwn() && !l.blocked(q) { // not the client's doing
		l.strike(r, q) // first: a block it lands is what the events and headers report
	}
	violated := 0
	var delay time.Duration
	for i := range q.res {
		if allowed {
			delay = max(delay, q.res[i].Delay)
		}
	}
	for i := range q.p.policies {
		if c.observer != nil {
			kind := EventAllowed
			if !allowed {
				kind = EventDenied
			}
			l.observe(r, q.p.policies[i].event, Event{Kind: kind, Key: q.subjects[i], Cost: q.cost, Latency: q.latency,
				Result: q.res[i], Local: q.local, DryRun: c.dryRun, Delay: delay})
		}
		if q.res[i].RetryAfter > q.res[violated].RetryAfter {
			violated = i
		}
	}
	var now time.Time // read only where a header needs the wall clock
	if c.profile&headers.XRateLimitEpoch != 0 {
		now = time.Now()
	}
	h := w.Header()
	if allowed || c.dryRun {
		for i := range q.p.policies {
			if pol := &q.p.policies[i]; pol.hdr != nil { // nil in dry-run mode
				pol.hdr.write(h, quota(pol, q.res[i]), now)
			}
		}
		if allowed && (len(q.refund) > 0 || c.penalty != nil && c.penalty.Failed != nil) {
			l.serveWatched(w, r, next, q)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	if pol := &q.p.policies[0]; len(q.p.policies) == 1 && pol.hdr != nil {
		pol.hdr.writeDenied(h, quota(pol, q.res[0]), q.res[0].RetryAfter, now)
	} else {
		for i := range q.p.policies {
			if pol := &q.p.policies[i]; pol.hdr != nil {
				pol.hdr.write(h, quota(pol, q.res[i]), now)
			}
		}
		headers.WriteRetryAfter(h, q.res[violated].RetryAfter)
	}
	if c.denied != nil {
		h["Cache-Control"] = []string{"no-store"} // the canonical key Header.Set would compute
		c.denied(w, r, q.res[violated])
		return
	}
	l.writeDenied(w, h, q.p.policies[violated].problem)
}

// quota turns pol's store result into what the headers report.
func quota(pol *policy, res store.Result) headers.Quota {
	window := res.Limit.Period
	// A calendar window's length varies (a month, a day of 23 hours): this one's.
	// Others are Period long, and computing none saves allocations per response.
	if w := res.Limit.Window; w != nil && (w.Location() != nil || res.Limit.Period == 0) {
		start, end := res.Limit.WindowAt(time.Now())
		window = end.Sub(start)
	}
	return headers.Quota{
		Name:      pol.name,
		Limit:     res.Limit.Burst, // the local share under FailLocal
		Rate:      res.Limit.Rate,
		Window:    window,
		Remaining: res.Remaining,
		Reset:     NextToken(res),
	}
}

// serveWatched serves the request, then gives its cost back to every
// policy's bucket if the refund rule says so, and counts a strike if the
// penalty's Failed does.
func (l *Limiter) serveWatched(w http.ResponseWriter, r *http.Request, next http.Handler, q *request) {
	sw := &statusWriter{ResponseWriter: w}
	next.ServeHTTP(sw, r)
	refund := len(q.refund) > 0 && l.cfg.refund(r, sw.code())
	p := l.cfg.penalty
	strike := p != nil && p.Failed != nil && !l.cfg.dryRun && !q.failed && p.Failed(r, sw.code())
	if p != nil && (refund || strike) && l.blockedNow(r, q) {
		// Blocked while it was served: no tokens back into the block, and
		// no strike; other subjects' policies (a global one) get theirs.
		if refund {
			keys := slices.Clone(q.refund)
			for i := range keys {
				if q.own(i) {
					keys[i] = ""
				}
			}
			l.giveBack(r, q, keys)
		}
		return
	}
	if refund {
		l.giveBack(r, q, q.refund)
	}
	if strike {
		l.strike(r, q)
	}
}

// blockedNow reads the bucket of q's first policy, through the breaker and
// within the budget, and reports whether it is in a block (a read that
// fails, or an open breaker, says no).
func (l *Limiter) blockedNow(r *http.Request, q *request) bool {
	res, err := l.call(context.WithoutCancel(r.Context()), func(ctx context.Context) ([]store.Result, error) {
		res, err := store.Inspect(ctx, l.store, string(q.keyOf(0)), q.p.policies[0].limit, q.cost)
		return []store.Result{res}, err
	})
	return err == nil && l.inBlock(res[0])
}

// own reports whether policy i keys by the subject of the first, whose
// strikes and block are the penalty's: a Multi's global or per-route
// policy is nobody's to block.
func (q *request) own(i int) bool {
	if i == 0 {
		return true
	}
	subject := func(i int) []byte { // a Multi's keys: "<prefix>{<subject>}"
		k := q.keyOf(i)
		return k[len(q.p.policies[i].prefix) : len(k)-1]
	}
	return bytes.Equal(subject(i), subject(0))
}

// refusedOwn reports whether one of the subject's own policies refused q (a
// refusal by a global limit is no fault of the client's).
func (q *request) refusedOwn() bool {
	for i := range q.res {
		if q.own(i) && q.res[i].RetryAfter > 0 {
			return true
		}
	}
	return false
}

// blocked reports whether q's refusal comes from a block.
func (l *Limiter) blocked(q *request) bool {
	return slices.ContainsFunc(q.res, l.inBlock)
}

// inBlock reports whether res's bucket is further from full than a whole
// bucket and the WithDelay queue (and the µs the store rounds up), where
// no take can put it: a block, until its last Burst tokens refill.
func (l *Limiter) inBlock(res store.Result) bool {
	return res.Limit.Window == nil && // a window quota is never blocked
		res.ResetAfter > tokenTime(res.Limit, res.Limit.Burst, true)+time.Microsecond+l.cfg.delay
}

// strike counts a strike against q's subject, in the bucket "}<store key of
// its first policy>" ('}' begins no limiter's key); the one that spends the
// last of them blocks the subject's own buckets not blocked yet (by a
// request that struck concurrently), forgives the strikes, and turns their
// results into what the store now says. Each step runs under the budget,
// even after the client has gone.
func (l *Limiter) strike(r *http.Request, q *request) {
	p := l.cfg.penalty
	keys := q.storeKeys()
	ctx := context.WithoutCancel(r.Context())
	res, err := l.call(ctx, func(ctx context.Context) ([]store.Result, error) {
		res, err := l.store.Take(ctx, "}"+keys[0], p.strikes(), 1)
		return []store.Result{res}, err
	})
	if err == nil && (!res[0].Allowed || res[0].Remaining > 0) {
		return // strikes left, or none: another request spent the last one
	}
	if err == nil {
		_, err = l.call(ctx, func(ctx context.Context) ([]store.Result, error) {
			for i, key := range keys {
				if !q.own(i) {
					continue
				}
				pol := &q.p.policies[i]
				res, err := store.Inspect(ctx, l.store, key, pol.limit, q.cost)
				if err == nil && !l.inBlock(res) {
					// WithDelay queues a request its wait ahead: block that much longer.
					if err = l.admin.Block(ctx, key, pol.limit, p.Block+l.cfg.delay); err == nil {
						if l.local != nil { // this server's FailLocal share, should the store fail in the block
							l.local.Block(ctx, key, pol.local, p.Block+l.cfg.delay)
						}
						res, err = store.Inspect(ctx, l.store, key, pol.limit, q.cost)
					}
				}
				if err != nil {
					return nil, err
				}
				if !res.Allowed { // queued from then on
					res.RetryAfter = max(res.RetryAfter-l.cfg.delay, time.Microsecond)
				}
				q.res[i] = res
			}
			return nil, l.admin.Reset(ctx, "}"+keys[0])
		})
	}
	if err != nil {
		if !errors.Is(err, ErrBreakerOpen) { // reported when it opened
			l.storeErrors.Add(1)
			l.observe(r, q.p.policies[0].event, Event{Kind: EventError, Key: q.subjects[0], Cost: q.cost,
				Err: fmt.Errorf("middleware: %s: penalty: %w", l.cfg.name, err)})
		}
		return
	}
	if l.deny != nil {
		l.deny.denied(q.keyOf(0), q.p.policies[0].limit, q.cost, q.res[0])
	}
}

// giveBack gives q's cost back to every policy's bucket, keys[i] that of
// policy i ("": not that one), within the budget even if the client has gone.
func (l *Limiter) giveBack(r *http.Request, q *request, keys []string) {
	if l.BreakerState() == BreakerOpen {
		l.refundFailed(r, q.cost, ErrBreakerOpen) // no waiting on a store known to fail
		return
	}
	refunder := l.store.(store.Refunder) // checked by New
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), l.cfg.timeout)
	defer cancel()
	for i, key := range keys {
		if lim := q.p.policies[i].limit; lim.Window != nil {
			took, _ := lim.WindowAt(q.at)
			if start, _ := lim.WindowAt(time.Now()); !took.Equal(start) { // read just before its refund
				continue // its window has ended: a count back in the next would loosen it
			}
		}
		if key == "" { // not to be given back
			continue
		}
		if l.local != nil && !q.local { // the mirror took them too
			l.local.Refund(ctx, key, q.p.policies[i].local, q.cost)
		}
		if _, err := refunder.Refund(ctx, key, q.p.policies[i].limit, q.cost); err != nil {
			l.refundFailed(r, q.cost, err)
		} else if l.deny != nil {
			// Tokens came back: a denial cached meanwhile may be wrong now.
			// (Other servers' caches keep theirs until they expire.)
			l.deny.forget([]byte(key))
		}
	}
}

// newPolicy returns the policy named name (already checked) of limit, in
// tier; tagged for a Multi's (see appendKey).
func (l *Limiter) newPolicy(tier, name string, limit store.Limit, key keyfuncs.KeyFunc, tagged bool) (policy, error) {
	if err := limit.ValidateDelay(l.cfg.delay); err != nil {
		return policy{}, fmt.Errorf("middleware: WithDelay: %w", err)
	}
	if p := l.cfg.penalty; p != nil {
		// A strike finds up to a whole bucket and the queue in debt.
		if err := limit.ValidateBlock(p.Block + 2*l.cfg.delay + tokenTime(limit, limit.Burst, true)); err != nil {
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
	c := &l.cfg
	if c.problemDetails {
		pol.problem = problemDocument(name)
	}
	if c.profile != 0 && !c.dryRun {
		pol.hdr = newFieldCache(c.profile, name, limit)
	}
	if c.policy.kind == failLocal && l.local != nil {
		// The same rate over n times the period: exactly 1/n of it; a
		// window quota's share, 1/n of its count in the same windows.
		pol.local = store.Limit{
			Rate:   limit.Rate,
			Period: limit.Period * time.Duration(c.policy.replicas),
			Burst:  max(1, limit.Burst/c.policy.replicas),
		}
		if limit.Window != nil {
			pol.local = limit
			pol.local.Rate = max(1, limit.Rate/c.policy.replicas)
			pol.local.Burst = pol.local.Rate
		}
		if err := pol.local.ValidateDelay(c.delay); err != nil {
			return policy{}, fmt.Errorf("middleware: FailLocalShare(%d): %w", c.policy.replicas, err)
		}
	}
	return pol, nil
}

// newPlan returns the plan of pols, and whether all of them key by the peer.
func newPlan(pols []policy) *plan {
	p := &plan{policies: pols, peer: true}
	for i := range pols {
		p.peer = p.peer && pols[i].key == nil
	}
	return p
}

// checkTier reports whether tier can prefix bucket names.
func checkTier(tier string) error {
	if tier == "" {
		return nil
	}
	if err := WithName(tier)(&config{}); err != nil || strings.Contains(tier, "/") {
		return fmt.Errorf("middleware: Tiers: tier %q: printable ASCII without '{', '}', ':' or '/'", tier)
	}
	return nil
}
