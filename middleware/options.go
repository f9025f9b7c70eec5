package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// DefaultTimeout is the budget for one store decision unless [WithTimeout]
// says otherwise. A store that has not answered by then has failed, and the
// [FailurePolicy] decides the request.
const DefaultTimeout = 100 * time.Millisecond

// FailurePolicy says what happens to a request when the store cannot decide
// it (an error, or no answer within the timeout), with its parameters:
// [FailOpen], [FailClosed] (or [FailClosedWith]) or [FailLocal] (or
// [FailLocalShare]). The default is FailLocal; the zero value is FailOpen.
type FailurePolicy struct {
	kind       failKind
	replicas   int           // FailLocal: servers sharing the limit
	status     int           // FailClosed: the status of a refusal
	retryAfter time.Duration // FailClosed: its Retry-After; 0 omits it
	err        error         // an unusable parameter, for WithFailurePolicy
}

type failKind uint8

const (
	failOpen failKind = iota
	failClosed
	failLocal
)

var (
	// FailOpen serves the request without limiting it and without rate-limit
	// headers. Choose it only where serving matters more than the limit: any
	// store stall longer than the budget (Redis paused, or this process
	// descheduled) then lets a flood through unlimited, for as long as the
	// breaker stays open.
	FailOpen = FailurePolicy{}
	// FailClosed refuses the request with 503 Service Unavailable and
	// Retry-After: 1 ([FailClosedWith] chooses them). Use it where letting
	// traffic through unlimited is worse than refusing it, such as a login
	// endpoint.
	FailClosed = FailurePolicy{kind: failClosed, status: http.StatusServiceUnavailable, retryAfter: time.Second}
	// FailLocal decides on an in-process Memory store, under the whole limit
	// ([FailLocalShare] divides it among servers): each server keeps about
	// its share of the limit while the shared store is down, and the shared
	// store decides again once it answers. It is the default: an ordinary API
	// stays up when Redis is down or slow, and a flood gets at most each
	// server's own bucket (a burst, then the rate) meanwhile, not the door.
	FailLocal = FailurePolicy{kind: failLocal, replicas: 1}
)

// FailClosedWith is [FailClosed] refusing with status (400 to 599) and
// Retry-After retryAfter (rounded up to whole seconds; 0 omits the header).
// Other values are an error of [WithFailurePolicy].
func FailClosedWith(status int, retryAfter time.Duration) FailurePolicy {
	p := FailurePolicy{kind: failClosed, status: status, retryAfter: retryAfter}
	switch {
	case status < 400 || status > 599:
		p.err = fmt.Errorf("FailClosedWith: status %d is not an error status", status)
	case retryAfter < 0:
		p.err = fmt.Errorf("FailClosedWith: negative Retry-After %v", retryAfter)
	}
	return p
}

// FailLocalShare is [FailLocal] for a limit shared by replicas servers: each
// then allows 1/replicas of the rate and of the burst (at least 1 token) on
// its own while the shared store is down. Below 1, it is an error of
// [WithFailurePolicy].
func FailLocalShare(replicas int) FailurePolicy {
	p := FailurePolicy{kind: failLocal, replicas: replicas}
	if replicas < 1 {
		p.err = fmt.Errorf("FailLocalShare: %d replicas: at least 1", replicas)
	}
	return p
}

// String returns the policy's name: "FailOpen", "FailClosed" or "FailLocal".
func (p FailurePolicy) String() string {
	switch p.kind {
	case failOpen:
		return "FailOpen"
	case failClosed:
		return "FailClosed"
	case failLocal:
		return "FailLocal"
	}
	return fmt.Sprintf("FailurePolicy(%d)", p.kind)
}

// Option configures a [Limiter].
type Option func(*config) error

type config struct {
	name            string
	keyFunc         keyfuncs.KeyFunc
	cost            func(*http.Request) int
	timeout         time.Duration
	policy          FailurePolicy
	denied          func(http.ResponseWriter, *http.Request, store.Result)
	keyError        func(http.ResponseWriter, *http.Request, error)
	skip            func(*http.Request) bool
	dryRun          bool
	profile         headers.Profile
	problemDetails  bool
	timeoutExplicit bool
	breakerFailures int
	breakerCooldown time.Duration
	denyKeys        int
	delay           time.Duration
	observer        Observer
	refund          func(*http.Request, int) bool
	allowNets       []netip.Prefix
	allowKeys       map[string]bool
}

// WithName sets the limiter's name, which namespaces its buckets in the
// store (the store key is "<name>:<subject>"; see the package doc) and
// names its policy in the RateLimit headers. Limiters with the same name on
// one store share their buckets: that is how the replicas of a limiter (the
// same program on several servers) share one limit, and how one budget
// spans several route groups. Name every limiter whose buckets are shared.
//
// The default is [DefaultName] of the limit, "@" and 8 hex digits naming the
// place in the code that called [New] and how many limiters it made before,
// such as "100-per-1m@9c1d02e7": two limiters of one process never share
// buckets by default (a strict /login and a loose /api of the same limit),
// and the replicas of a program share theirs as long as they make their
// limiters in the same order from the same code. A deploy that moves the
// call, or a limiter made again (a configuration reload), starts new
// buckets; WithName keeps them.
//
// The name must be non-empty printable ASCII without '{', '}' or ':',
// which would let its keys collide with another limiter's or pin them to
// one Redis Cluster slot. Two limiters with the same name on one route
// report one header item.
func WithName(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("WithName: empty name")
		}
		for i := 0; i < len(name); i++ {
			if name[i] < 0x20 || name[i] > 0x7e {
				return fmt.Errorf("WithName: %q: only printable ASCII is allowed", name)
			}
			if name[i] == '{' || name[i] == '}' || name[i] == ':' {
				return fmt.Errorf("WithName: %q: '{', '}' and ':' are not allowed", name)
			}
		}
		c.name = name
		return nil
	}
}

// WithKeyFunc sets how a request's subject is found. The default is
// [keyfuncs.PeerIP]: the TCP peer's address, port stripped, IPv6 grouped by
// /64 (built in place, with no allocation for the subject). Behind a proxy, use a resolver that trusts it, or an API-key or user
// key. A KeyFunc error never falls back to a shared bucket: the request is
// refused (see [WithKeyErrorHandler]).
func WithKeyFunc(fn keyfuncs.KeyFunc) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithKeyFunc: nil KeyFunc")
		}
		c.keyFunc = fn
		return nil
	}
}

// WithCost sets the tokens a request costs (default 1), for example by route
// or body size. A cost of 0 only reads the bucket. A cost below 0 or above
// the limit's Burst can never be allowed: such a request is answered by the
// key-error handler (400 by default), never with a 429 that would invite a
// retry.
func WithCost(fn func(r *http.Request) int) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithCost: nil func")
		}
		c.cost = fn
		return nil
	}
}

// WithTimeout sets the budget for one store decision (default
// [DefaultTimeout]). No request waits on the store longer than d; past it
// the failure policy decides. It must be positive. The Memory store never
// waits, so the budget does not apply to it.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithTimeout: %v: the budget must be positive", d)
		}
		c.timeout, c.timeoutExplicit = d, true
		return nil
	}
}

// WithFailurePolicy sets what happens when the store cannot decide (default
// [FailLocal]): [FailOpen], [FailClosed], [FailClosedWith], FailLocal or
// [FailLocalShare].
func WithFailurePolicy(p FailurePolicy) Option {
	return func(c *config) error {
		if p.err != nil {
			return fmt.Errorf("WithFailurePolicy: %w", p.err)
		}
		if p.kind > failLocal {
			return fmt.Errorf("WithFailurePolicy: unknown policy %v", p)
		}
		c.policy = p
		return nil
	}
}

// WithBreaker configures the circuit breaker in front of the store (default
// [DefaultBreakerFailures] consecutive failures, [DefaultBreakerCooldown]).
// After `failures` consecutive store errors or timeouts it opens: decisions
// take the failure policy at once, without calling the store, so a dead
// Redis costs no waiting per request. After `cooldown` one decision probes
// the store; its success closes the breaker. A probe that fails, panics,
// whose client goes away, or that has not come back within a cooldown
// counts as a failure: the breaker always probes again. failures 0 disables the
// breaker. Transitions go to the [Observer] ([WithObserver]), or without one
// to [slog.Default]. The breaker does not apply to a Memory store.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(c *config) error {
		if failures < 0 {
			return fmt.Errorf("WithBreaker: %d failures: must not be negative", failures)
		}
		if failures > 0 && cooldown <= 0 {
			return fmt.Errorf("WithBreaker: cooldown %v: must be positive", cooldown)
		}
		c.breakerFailures, c.breakerCooldown = failures, cooldown
		return nil
	}
}

// WithDelay lets a request that would be refused wait for its tokens, as
// nginx's limit_req does with a burst and no nodelay: if they will be there
// within max, they are taken now, in the same store call (its place in line
// is kept), and the request is served when they are due; one that would
// wait longer is refused at once. Waiting requests are thus spaced at the
// rate. A client that goes away while it waits gets its tokens given back.
// The default, 0, refuses at once.
//
// A waiting request holds its goroutine (and its connection): at most
// max × Rate / Period of them per key. A store failure never makes a
// request wait (the failure policy decides at once); in dry-run mode the
// wait is reported (Event.Delay), not applied. The store must be a
// [store.Delayer] and a [store.Refunder], as both of tollgate's are.
func WithDelay(max time.Duration) Option {
	return func(c *config) error {
		if max < 0 {
			return fmt.Errorf("WithDelay(%v): the wait must not be negative", max)
		}
		c.delay = max
		return nil
	}
}

// WithDenyCache makes the limiter remember the store's denials of up to
// maxKeys keys, so that under a flood from one client most refusals are
// answered without asking the store. 0, the default, turns it off; a
// negative maxKeys is an error.
//
// When the store denies a request of cost c on a key, the limiter records
// when the store said c tokens would be there again (Retry-After). Until
// then, a request on that key of cost c or more under the same limit is
// refused locally: a 429 like the store's, with the same events and denied
// handler, and headers computed from the store's answer (RateLimit r and t
// as the store would say them, Retry-After at least 1). That is sound because
// tokens only return with time: the store would refuse such a request too,
// and requests from other servers only make its bucket emptier. A cheaper
// request (cost below c, or 0, which only reads) still goes to the store and
// may pass. When the time has come, one request (the probe) goes to the
// store; while it is out, the others of cost c or more are still refused,
// until the next c tokens are due, since the probe takes the ones that came
// back (should the probe be denied after all, they might have passed: the
// one case where the cache refuses what the store would allow). A probe
// that is denied renews the entry; one that is allowed, or that the store
// fails to answer, removes it.
//
// The cache runs on this process's monotonic clock, read when the store's
// answer arrives, so a local refusal can outlast the store's (Redis's clock)
// by up to one round trip, never end earlier. It is per process: each
// server learns the denials it was given. Memory is bounded by maxKeys
// entries (about 150 bytes each, whatever the key: it keeps a 128-bit hash
// of it): entries past their time are dropped when met and when room is
// needed, and otherwise the one that expires first. No goroutine is started. Locally refused requests are
// counted in [Stats].DenyCacheHits.
//
// It is off by default because it answers from a copy of the store's
// state: code that resets buckets in the store or moves its clock (tests on
// miniredis, an operator deleting a key to let a client back in) would
// still see refusals here until the recorded time. In dry-run mode
// ([WithDryRun]) the cache is not used, so that it cannot change what is
// reported.
func WithDenyCache(maxKeys int) Option {
	return func(c *config) error {
		if maxKeys < 0 {
			return fmt.Errorf("WithDenyCache: %d keys: must not be negative", maxKeys)
		}
		c.denyKeys = maxKeys
		return nil
	}
}

// WithDeniedHandler sets what answers a request over the limit. It is
// called with the rate-limit headers, Retry-After and Cache-Control:
// no-store already set, and must write the status (normally 429) and body.
// The default writes 429 with a short text body, or a problem document with
// [WithProblemDetails].
func WithDeniedHandler(fn func(w http.ResponseWriter, r *http.Request, res store.Result)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithDeniedHandler: nil func")
		}
		c.denied = fn
		return nil
	}
}

// WithKeyErrorHandler sets what answers a request the limiter cannot rate:
// its KeyFunc failed, or its cost is outside [0, Burst]. The default
// answers 400 Bad Request with a short text body (never the error's text),
// or 500 when the error wraps [keyfuncs.ErrInvalidConfig].
// The request is never counted against a shared bucket.
func WithKeyErrorHandler(fn func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithKeyErrorHandler: nil func")
		}
		c.keyError = fn
		return nil
	}
}

// WithSkip sets a predicate evaluated first, before the KeyFunc and any
// store call: requests for which it returns true pass unlimited and without
// rate-limit headers (health checks, allow-listed clients).
func WithSkip(fn func(r *http.Request) bool) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithSkip: nil func")
		}
		c.skip = fn
		return nil
	}
}

// WithDryRun makes the limiter decide and report every request (tokens are
// taken, events reported with Event.DryRun set) but never refuse one, and write
// no rate-limit headers: a shadow mode to try a limit on real traffic.
func WithDryRun(on bool) Option {
	return func(c *config) error {
		c.dryRun = on
		return nil
	}
}

// WithHeaders selects the rate-limit headers written on every decided
// response (default [headers.Default]: the draft-11 RateLimit and
// RateLimit-Policy fields and the draft-03 RateLimit-Limit/-Remaining/-Reset
// trio). 0 writes none; Retry-After is written on refusals regardless.
func WithHeaders(p headers.Profile) Option {
	return func(c *config) error {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("WithHeaders: %w", err)
		}
		c.profile = p
		return nil
	}
}

// WithProblemDetails makes the default denied response an RFC 9457
// application/problem+json document of type
// https://iana.org/assignments/http-problem-types#quota-exceeded, naming the
// violated policy in "violated-policies".
func WithProblemDetails() Option {
	return func(c *config) error {
		c.problemDetails = true
		return nil
	}
}

// WithObserver sends the limiter's events — allowed, denied, error,
// fallback, breaker and skipped — to o, with the limiter's name, the class
// of the key (never the key itself), the cost and the time the decision
// took. See [SlogObserver] for log/slog; package promobserver (a module of
// its own) exports them to Prometheus.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("WithObserver: nil Observer")
		}
		c.observer = o
		return nil
	}
}

// WithRefund gives a request's tokens back after its response when
// rule(r, status) is true, status being the code the handler wrote (200 if
// it wrote none). Refund on 5xx (the client should not pay for the
// server's failure), or count only failed logins: charge every attempt,
// refund those that succeed, so that a client is refused after 5 failures
// whatever its successes. Tokens come back only up to the bucket's
// capacity. A refund is one more store call, made after the handler
// returned, under the limiter's timeout; a failed refund is reported
// through the observer (EventError) and otherwise ignored (the
// tokens stay taken: the limit errs on the strict side). The store must
// implement [store.Refunder], as [store.Memory] and [store.Redis] do.
func WithRefund(rule func(r *http.Request, status int) bool) Option {
	return func(c *config) error {
		if rule == nil {
			return errors.New("WithRefund: nil rule")
		}
		c.refund = rule
		return nil
	}
}

// WithAllowList lets requests through without asking the store: each entry
// is either an IP address or a CIDR prefix ("10.0.0.0/8", "2001:db8::1"),
// matched against the client's address, or a key, matched exactly against
// the subject the key function returns ("user:admin", "key:…").
// Allow-listed requests get no rate-limit headers and are reported as
// skipped.
//
// The client's address is the one [keyfuncs.ClientIPMiddleware] resolved;
// else the one the key function resolved through the trusted proxies
// ([keyfuncs.ClientIP] or [keyfuncs.ClientIPFromContext], alone, in
// [keyfuncs.Join] or in a function of your own: they record it in the
// request's [keyfuncs.WithAddressSlot]); else the TCP peer. The address is
// matched whole, however the key groups it. Behind a load balancer, key by
// ClientIP or run ClientIPMiddleware: with any other key function an entry
// is matched against the balancer's address. An allow-listed client needs
// no key; when the key function does not read the peer, it runs first (the
// request is copied to carry the slot).
func WithAllowList(entries ...string) Option {
	return func(c *config) error {
		for _, e := range entries {
			if p, ok, err := parseAllowNet(e); err != nil {
				return fmt.Errorf("WithAllowList: %q: %w", e, err)
			} else if ok {
				c.allowNets = append(c.allowNets, p)
				continue
			}
			// A key: "<namespace>:<subject>", as the key functions write them.
			ns, rest, ok := strings.Cut(e, ":")
			if !ok || ns == "" || rest == "" || strings.TrimFunc(ns, isLower) != "" {
				return fmt.Errorf("WithAllowList: %q is neither an IP address, a CIDR prefix nor a key such as \"user:admin\"", e)
			}
			if c.allowKeys == nil {
				c.allowKeys = map[string]bool{}
			}
			c.allowKeys[e] = true
		}
		return nil
	}
}

func isLower(r rune) bool { return 'a' <= r && r <= 'z' }

// parseAllowNet reads an allow-list entry as an address or a prefix (ok),
// or says it is none (a key), or that it is a malformed one.
func parseAllowNet(e string) (p netip.Prefix, ok bool, err error) {
	addr, bits, isPrefix := strings.Cut(e, "/")
	a, aerr := netip.ParseAddr(addr)
	if aerr != nil {
		if strings.Trim(e, "0123456789abcdefABCDEF.:/%[] ") == "" {
			return p, false, fmt.Errorf("not an IP address or prefix: %w", aerr)
		}
		return p, false, nil // a key
	}
	if !isPrefix {
		a = a.Unmap().WithZone("")
		return netip.PrefixFrom(a, a.BitLen()), true, nil
	}
	if p, err = netip.ParsePrefix(e); err != nil {
		return p, false, err
	}
	if a.Is4In6() { // clients' addresses are unmapped: so is the prefix
		if p.Bits() < 96 {
			return p, false, fmt.Errorf("an IPv4-mapped prefix shorter than /96 (%s)", bits)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), true, nil
}

// The allow-list's networks are matched against the client's address,
// taken from the first of these that has one:
//
//  1. the address keyfuncs.ClientIPMiddleware resolved (allowedResolved,
//     before the key is built);
//  2. the address the key function resolved through the trusted proxies,
//     recorded in the request's address slot (keyfuncs.WithAddressSlot) by
//     ClientIP or ClientIPFromContext, alone, in a Join or in a function of
//     the app's own — never a subject that merely looks like "ip:…", which
//     a client may have written;
//  3. the TCP peer, RemoteAddr.
//
// So an entry behind a load balancer matches the client that ClientIP
// finds, not the balancer, which would let every client through.

// allowedResolved reports whether r carries a client address that
// keyfuncs.ClientIPMiddleware resolved (known), and whether it is
// allow-listed.
func (c *config) allowedResolved(r *http.Request) (allowed, known bool) {
	if len(c.allowNets) == 0 {
		return false, true
	}
	a, ok := keyfuncs.ClientAddr(r.Context())
	if !ok {
		return false, false
	}
	return c.allowedAddr(a), true
}

// slotted returns r with an address slot for its key functions to fill
// (see allowedAt), unless the allow-list was decided already (known): only
// then does it allocate.
func slotted(r *http.Request, known bool) (*http.Request, *netip.Addr) {
	if known {
		return r, nil
	}
	slot := new(netip.Addr)
	return r.WithContext(keyfuncs.WithAddressSlot(r.Context(), slot)), slot
}

// allowedAt reports whether the client of r is allow-listed: the address a
// key function recorded in slot, else the TCP peer.
func (c *config) allowedAt(r *http.Request, slot netip.Addr) bool {
	if slot.IsValid() {
		return c.allowedAddr(slot)
	}
	return c.allowedPeer(r)
}

// peerAddr returns r's TCP peer address, unmapped and without a zone, or
// the zero Addr.
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	a := ap.Addr()
	if err != nil {
		if a, err = netip.ParseAddr(r.RemoteAddr); err != nil {
			return netip.Addr{}
		}
	}
	return a.Unmap().WithZone("")
}

// allowedPeer reports whether r's TCP peer is allow-listed.
func (c *config) allowedPeer(r *http.Request) bool {
	a := peerAddr(r)
	return a.IsValid() && c.allowedAddr(a)
}

// allowedAddr reports whether a is allow-listed.
func (c *config) allowedAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	return c.allowedPrefix(netip.PrefixFrom(a, a.BitLen()))
}

// allowedPrefix reports whether an allow-listed network holds all of p.
func (c *config) allowedPrefix(p netip.Prefix) bool {
	for _, n := range c.allowNets {
		if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}
