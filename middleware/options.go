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
	penalty         *Penalty
	allowNets       []netip.Prefix
	allowKeys       map[string]bool
}

// WithName sets the limiter's name, which namespaces its buckets in the
// store ("<name>:<subject>") and names its policy in the RateLimit headers.
// Limiters of one name on one store share their buckets: so the replicas of
// a program share one limit, and one budget can span route groups. Name
// every limiter whose buckets are shared. The default, such as
// "100-per-1m@9c1d02e7", is [DefaultName] of the limit and a hash of the
// place in the code that called [New] and of how many limiters it made
// before: no two limiters of a process share buckets by default, and the
// replicas of a program share theirs while they make their limiters in the
// same order from the same code (a moved call or a reload starts new
// buckets; WithName keeps them). The name is non-empty printable ASCII
// without '{', '}' or ':', which could make keys collide or pin a slot.
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
// [keyfuncs.PeerIP], the TCP peer's address (IPv6 by /64), built with no
// allocation. Behind a proxy, use [keyfuncs.ClientIP] with its networks, or
// an API-key or user key. A KeyFunc error never falls back to a shared
// bucket: the request is refused ([WithKeyErrorHandler]).
func WithKeyFunc(fn keyfuncs.KeyFunc) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithKeyFunc: nil KeyFunc")
		}
		c.keyFunc = fn
		return nil
	}
}

// WithCost sets the tokens a request costs (default 1); 0 only reads the
// bucket. A cost below 0 or above Burst can never be allowed: the key-error
// handler answers it (400 by default), never a 429 inviting a retry.
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
// [DefaultTimeout]), positive: past it the failure policy decides. The
// Memory store never waits, so it does not apply there.
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
// [DefaultBreakerFailures], [DefaultBreakerCooldown]; failures 0 disables
// it). After failures consecutive errors or timeouts it opens: the failure
// policy decides at once, so a dead Redis costs no waiting per request.
// After cooldown one decision probes the store and its success closes it; a
// probe that fails, panics, is abandoned or does not return within a
// cooldown counts as a failure, so the breaker always probes again.
// Transitions go to the [Observer], or to [slog.Default] without one.
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
// within max, they are taken now in the same store call and the request is
// served when they are due, so waiting requests are spaced at the rate; one
// that would wait longer is refused at once (the default, 0, refuses all).
// A client that leaves while it waits gets its tokens back. A waiting
// request holds its goroutine: at most max × Rate / Period per key. A store
// failure never makes a request wait; in dry-run mode the wait is reported
// (Event.Delay), not applied. The store must be a [store.Delayer] and a
// [store.Refunder], as both of tollgate's are.
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
// maxKeys keys (0, the default: off), so that a flood from one client is
// refused mostly without asking the store. A key the store denied at cost c
// is refused locally, for cost c or more under the same limit, until the
// store's Retry-After: sound, because tokens only return with time. Then one
// request probes the store (the others are still refused until the next c
// tokens are due); a denied probe renews the entry. The cache runs on this
// process's clock, read when the store's answer arrives, so a local refusal
// can outlast the store's by a round trip, never end earlier. Each entry
// keeps a 128-bit hash of its key, about 150 bytes; past maxKeys the one
// that expires first goes. Local refusals count in [Stats].DenyCacheHits.
// It is off by default because it answers from a copy of the store's
// state: a bucket reset in the store stays refused here until the recorded
// time (see [Limiter.Forget]). Dry-run mode does not use it.
func WithDenyCache(maxKeys int) Option {
	return func(c *config) error {
		if maxKeys < 0 {
			return fmt.Errorf("WithDenyCache: %d keys: must not be negative", maxKeys)
		}
		c.denyKeys = maxKeys
		return nil
	}
}

// WithDeniedHandler sets what answers a request over the limit, called with
// the rate-limit headers, Retry-After and Cache-Control: no-store set; it
// writes the status (normally 429) and body. The default writes 429 with a
// short text, or a problem document ([WithProblemDetails]).
func WithDeniedHandler(fn func(w http.ResponseWriter, r *http.Request, res store.Result)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithDeniedHandler: nil func")
		}
		c.denied = fn
		return nil
	}
}

// WithKeyErrorHandler sets what answers a request the limiter cannot rate
// (a KeyFunc error, or a cost outside [0, Burst]), never counted against a
// shared bucket. The default answers 400 with a short text (never the
// error's), or 500 when the error wraps [keyfuncs.ErrInvalidConfig].
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

// WithObserver sends the limiter's events (allowed, denied, error, fallback,
// breaker, skipped, abandoned) to o, with the limiter's name, the class of
// the key (never the key), the cost and the latency. See [SlogObserver];
// the promobserver and otelobserver modules export them as metrics.
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
// rule(r, status) is true (status 200 if the handler wrote none): refund
// 5xx, or charge every login and refund the successful ones so that 5
// failures lock a client out. Tokens come back up to capacity, in one more
// store call under the timeout; a failed refund is reported (EventError)
// and the tokens stay taken. The store must be a [store.Refunder].
func WithRefund(rule func(r *http.Request, status int) bool) Option {
	return func(c *config) error {
		if rule == nil {
			return errors.New("WithRefund: nil rule")
		}
		c.refund = rule
		return nil
	}
}

// Penalty is a penalty box ([WithPenalty]).
type Penalty struct {
	Strikes int           // the strikes that block a key, at least 1
	Within  time.Duration // they count in a bucket of Strikes refilled over Within
	Block   time.Duration // how long a blocked key is refused
	// Failed, if set, makes a served request a strike too when it reports
	// true for the request and the status its handler wrote, such as a
	// failed login (401).
	Failed func(r *http.Request, status int) bool
}

// WithPenalty puts a key in a penalty box: once Strikes of its requests,
// within about Within, were refused (429) or, with Failed, failed, its
// buckets refuse every request that costs tokens for Block, on top of their
// debt, and then refill at the rate. On a [Multi] the key is the first
// policy's subject, so put a per-client policy first: policies of other
// subjects (a global limit) are neither blocked nor a source of strikes. The block is the buckets' own state
// (store.Admin.Block), so the one store call of every decision, on every
// server, checks it; the 429's Retry-After is the time left, and the keys'
// TTL ends it; the FailLocal share of the server that lands it is blocked
// too (Limiter.Forget does not end that one), and with WithDelay
// the block is MaxDelay longer, so that nothing is queued into it. Nothing
// during a block is a strike, a request that ends in it gets no refund, and
// of two requests that spend the last strike at once the second finds the
// buckets blocked. With refunds or Failed, a request that ends reads its
// bucket first: one more store call. Strikes count in a bucket of their own beside the key's (Strikes
// per Within, burst Strikes), one store call per strike; a store failure
// loses the strike, and requests the failure policy decided count none, nor
// does dry-run mode. The store must be a
// [store.Admin], as both of tollgate's are.
func WithPenalty(p Penalty) Option {
	return func(c *config) error {
		if p.Strikes < 1 || p.Within <= 0 || p.Block <= 0 {
			return fmt.Errorf("WithPenalty: %d strikes within %v, blocked %v: all must be positive", p.Strikes, p.Within, p.Block)
		}
		if err := p.strikes().Validate(); err != nil {
			return fmt.Errorf("WithPenalty: %w", err)
		}
		c.penalty = &p
		return nil
	}
}

// strikes is the Limit of a key's strikes.
func (p *Penalty) strikes() store.Limit {
	return store.Limit{Rate: p.Strikes, Period: p.Within, Burst: p.Strikes}
}

// WithAllowList lets requests through unlimited, without headers and
// reported as skipped, when the client's address is in an entry's network
// ("10.0.0.0/8", "2001:db8::1") or the subject equals an entry that is a key
// ("user:admin"). The address is the one [keyfuncs.ClientIPMiddleware]
// resolved, else the one the key function resolved through trusted proxies
// (ClientIP and ClientIPFromContext record it, also inside [keyfuncs.Join]
// or a function of your own), else the TCP peer: behind a load balancer,
// key by ClientIP or run ClientIPMiddleware, or entries match the balancer.
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
