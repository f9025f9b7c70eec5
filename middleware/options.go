package middleware

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// DefaultTimeout is the budget of one store decision unless [WithTimeout] says otherwise.
const DefaultTimeout = 100 * time.Millisecond

// FailurePolicy decides requests the store cannot (an error, a timeout); the zero value is [FailOpen].
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
	// FailOpen serves the request unlimited, without rate-limit headers: a store stall lets a flood in.
	FailOpen = FailurePolicy{}
	// FailClosed refuses the request with 503 Service Unavailable and Retry-After: 1, as for a login.
	FailClosed = FailurePolicy{kind: failClosed, status: http.StatusServiceUnavailable, retryAfter: time.Second}
	// FailLocal, the default, decides on an in-process Memory store under the whole limit per server
	// ([FailLocalShare]), following what the server let through: an outage gives nobody a fresh burst.
	FailLocal = FailurePolicy{kind: failLocal, replicas: 1}
)

// FailClosedWith is [FailClosed] refusing with status (400 to 599) and Retry-After retryAfter (rounded
// up to whole seconds; 0 omits the header, but a 429 always has one). Other values are an error of
// [WithFailurePolicy].
func FailClosedWith(status int, retryAfter time.Duration) FailurePolicy {
	return FailurePolicy{kind: failClosed, status: status, retryAfter: retryAfter, err: cmp.Or(
		failIf(status < 400 || status > 599, "FailClosedWith: status %d is not an error status", status),
		failIf(retryAfter < 0, "FailClosedWith: negative Retry-After %v", retryAfter),
		failIf(status == http.StatusTooManyRequests && retryAfter == 0, "FailClosedWith: a 429 needs a Retry-After of at least 1s"))}
}

// FailLocalShare is [FailLocal] for a limit shared by replicas servers: each allows 1/replicas of the
// rate and burst (at least 1 token; a cost above is taken from a full bucket, then repaid at the rate;
// over a window quota's share it takes all, once a window) alone. Below 1: a [WithFailurePolicy] error.
func FailLocalShare(replicas int) FailurePolicy {
	return FailurePolicy{kind: failLocal, replicas: replicas,
		err: failIf(replicas < 1, "FailLocalShare: %d replicas: at least 1", replicas)}
}

// String returns the policy's name: "FailOpen", "FailClosed" or "FailLocal".
func (p FailurePolicy) String() string {
	return [...]string{failOpen: "FailOpen", failClosed: "FailClosed", failLocal: "FailLocal"}[p.kind]
}

// Option configures a [Limiter] or a [Multi].
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

func option(err error, set func(*config)) Option {
	return func(c *config) error {
		if err == nil {
			set(c)
		}
		return err
	}
}

func failIf(bad bool, format string, args ...any) error {
	if !bad {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// WithName sets the limiter's name, printable ASCII without '{', '}' or ':', which names its buckets
// and its RateLimit policy (see the package doc). The default, such as "100-per-1m@9c1d02e7", is
// [DefaultName] and a hash of where [New] was called and how many limiters that place made before:
// name those made in a loop, a helper or per tenant, and any whose buckets must outlive an edit.
func WithName(name string) Option {
	return option(checkName("WithName", name), func(c *config) { c.name = name })
}

// checkName refuses, for option what, a name that could collide keys or pin a slot.
func checkName(what, name string) error {
	switch {
	case name == "":
		return errors.New(what + ": empty name")
	case strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r > 0x7e }):
		return fmt.Errorf("%s: %q: only printable ASCII is allowed", what, name)
	case strings.ContainsAny(name, "{}:"):
		return fmt.Errorf("%s: %q: '{', '}' and ':' are not allowed", what, name)
	}
	return nil
}

// WithKeyFunc sets how a request's subject is found (default [keyfuncs.PeerIP], the TCP peer; behind
// a proxy, [keyfuncs.ClientIP]); a KeyFunc error goes to [WithKeyErrorHandler], never a shared bucket.
func WithKeyFunc(fn keyfuncs.KeyFunc) Option {
	return option(failIf(fn == nil, "WithKeyFunc: nil KeyFunc"), func(c *config) { c.keyFunc = fn })
}

// WithCost sets a request's cost in tokens (default 1; 0 reads the bucket; outside [0, Burst]: a key error).
func WithCost(fn func(r *http.Request) int) Option {
	return option(failIf(fn == nil, "WithCost: nil func"), func(c *config) { c.cost = fn })
}

// WithTimeout sets the budget of one store decision (default [DefaultTimeout]; a Memory has none):
// a [store.Budget], under the request's values and sooner deadline, not its cancellation.
func WithTimeout(d time.Duration) Option {
	return option(failIf(d <= 0, "WithTimeout: %v: the budget must be positive", d), func(c *config) { c.timeout = d })
}

// WithFailurePolicy sets the [FailurePolicy] of requests the store cannot decide (default [FailLocal]);
// one whose own context ends first (a deadline the app set) is refused with 503 whatever the policy.
func WithFailurePolicy(p FailurePolicy) Option {
	return option(failIf(p.err != nil, "WithFailurePolicy: %w", p.err), func(c *config) { c.policy = p })
}

// WithBreaker sets the circuit breaker in front of the store (default [DefaultBreakerFailures],
// [DefaultBreakerCooldown]; failures 0: none): failures consecutive errors or timeouts open it
// ([BreakerState]) until a probe succeeds, the first 10 ms after it opened, each next one after
// twice the last wait, up to cooldown; a probe that fails, panics, is abandoned or outlasts a
// cooldown fails. So does a request's deadline that left the call a quarter of the budget or more
// (not a client that left). Transitions go to the [Observer], or [slog.Default].
func WithBreaker(failures int, cooldown time.Duration) Option {
	return option(cmp.Or(
		failIf(failures < 0, "WithBreaker: %d failures: must not be negative", failures),
		failIf(failures > 0 && cooldown <= 0, "WithBreaker: cooldown %v: must be positive", cooldown)),
		func(c *config) { c.breakerFailures, c.breakerCooldown = failures, cooldown })
}

// WithDelay lets a request that would be refused wait up to max (default 0) for its tokens, as
// nginx's limit_req with a burst: taken ahead in the same store call, they are due spaced at the
// rate. A client that leaves gets them back; a waiter holds its goroutine (at most max × Rate /
// Period per key). The store must be a [store.Delayer] and a [store.Refunder].
func WithDelay(max time.Duration) Option {
	return option(failIf(max < 0, "WithDelay(%v): the wait must not be negative", max), func(c *config) { c.delay = max })
}

// WithDenyCache makes the limiter remember the store's denials of up to maxKeys keys (default 0:
// off; about 150 bytes each): a key denied at cost c is refused without a store call at cost c or
// more until the store's Retry-After, then one request probes the store. A bucket reset in the
// store stays refused here ([Limiter.Forget]). Dry-run mode and window quotas do not use it.
func WithDenyCache(maxKeys int) Option {
	return option(failIf(maxKeys < 0, "WithDenyCache: %d keys: must not be negative", maxKeys), func(c *config) { c.denyKeys = maxKeys })
}

// WithDeniedHandler sets what answers a request over the limit (rate-limit headers, Retry-After and
// Cache-Control: no-store set); the default writes 429 and a short text, or [WithProblemDetails]'s.
func WithDeniedHandler(fn func(w http.ResponseWriter, r *http.Request, res store.Result)) Option {
	return option(failIf(fn == nil, "WithDeniedHandler: nil func"), func(c *config) { c.denied = fn })
}

// WithKeyErrorHandler sets what answers a request the limiter cannot rate (a KeyFunc error, or a cost
// outside [0, Burst]); by default 400, or 500 if err wraps [keyfuncs.ErrInvalidConfig], never its text.
func WithKeyErrorHandler(fn func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return option(failIf(fn == nil, "WithKeyErrorHandler: nil func"), func(c *config) { c.keyError = fn })
}

// WithSkip passes requests fn is true for (health checks) first, unlimited, without headers (default: none).
func WithSkip(fn func(r *http.Request) bool) Option {
	return option(failIf(fn == nil, "WithSkip: nil func"), func(c *config) { c.skip = fn })
}

// WithDryRun, if on (default off), makes the limiter decide and report every request (Event.DryRun)
// but never refuse, delay or write headers: a shadow mode.
func WithDryRun(on bool) Option {
	return option(nil, func(c *config) { c.dryRun = on })
}

// WithHeaders selects the rate-limit headers of every decided response (default [headers.Default];
// 0 writes none but a refusal's Retry-After). Responses share the values: code after the limiter
// must replace a field, as [http.Header.Set] does, not write into it.
func WithHeaders(p headers.Profile) Option {
	err := p.Validate()
	return option(failIf(err != nil, "WithHeaders: %w", err), func(c *config) { c.profile = p })
}

// WithProblemDetails makes the default 429 body an RFC 9457 "…#quota-exceeded" problem naming the policy.
func WithProblemDetails() Option {
	return option(nil, func(c *config) { c.problemDetails = true })
}

// WithObserver sends the limiter's events to o (default: none), such as
// [SlogObserver]; promobserver and otelobserver export them as metrics.
func WithObserver(o Observer) Option {
	return option(failIf(o == nil, "WithObserver: nil Observer"), func(c *config) { c.observer = o })
}

// WithRefund gives a request's tokens back after its response when rule(r, status) is true (default:
// never; status 200 if the handler wrote none), as for 5xx, or for successful logins so that only
// failures count: one more store call (a failure is an EventError), on a [store.Refunder].
func WithRefund(rule func(r *http.Request, status int) bool) Option {
	return option(failIf(rule == nil, "WithRefund: nil rule"), func(c *config) { c.refund = rule })
}

// Penalty is a penalty box ([WithPenalty]).
type Penalty struct {
	Strikes int           // the strikes that block a key, at least 1
	Within  time.Duration // they count in a bucket of Strikes refilled over Within
	Block   time.Duration // how long a blocked key is refused beyond what its bucket owed
	// Failed, if set, makes a served request it is true for a strike too (a 401 login).
	Failed func(r *http.Request, status int) bool
}

// WithPenalty puts a key in a penalty box (default: none): once Strikes of its requests within about
// Within were refused (429) or, with Failed, failed, its buckets refuse every request that costs
// tokens for Block on top of their debt (up to Burst*Period/Rate for a bucket refused already) and
// the WithDelay wait, then refill at the rate from empty (Block 15m on PerHour(5): up to 87m). On a
// [Multi] the key is the first policy's subject, whose policies alone are blocked and strikes. The
// block is the buckets' state ([store.Admin].Block), seen by every server and this one's FailLocal
// share; it counts no strikes and gets no refunds (with refunds or Failed, one more store call
// reads the bucket). A strike is a store call, lost if it fails; the failure policy and dry-run
// count none.
func WithPenalty(p Penalty) Option {
	err := p.strikes().Validate()
	return option(cmp.Or(failIf(p.Strikes < 1 || p.Within <= 0 || p.Block <= 0,
		"WithPenalty: %d strikes within %v, blocked %v: all must be positive", p.Strikes, p.Within, p.Block),
		failIf(err != nil, "WithPenalty: %w", err)), func(c *config) { c.penalty = &p })
}

func (p *Penalty) strikes() store.Limit {
	return store.Limit{Rate: p.Strikes, Period: p.Within, Burst: p.Strikes}
}

// WithAllowList lets requests pass as [WithSkip] does (default: none) when the client's address is
// in an entry's network ("10.0.0.0/8", "2001:db8::1") or the subject is a key entry ("user:admin");
// the address is what [keyfuncs.ClientIPMiddleware], else [keyfuncs.ClientIP], resolved, else the peer.
func WithAllowList(entries ...string) Option {
	return func(c *config) error {
		for _, e := range entries {
			p, err := parseAllowNet(e)
			ns, subject, _ := strings.Cut(e, ":") // a key is "<namespace>:<subject>"
			switch {
			case err != nil:
				return fmt.Errorf("WithAllowList: %q: %w", e, err)
			case p.IsValid():
				c.allowNets = append(c.allowNets, p)
			case ns == "" || subject == "" || strings.TrimFunc(ns, func(r rune) bool { return 'a' <= r && r <= 'z' }) != "":
				return fmt.Errorf("WithAllowList: %q is neither an IP address, a CIDR prefix nor a key such as \"user:admin\"", e)
			case c.allowKeys == nil:
				c.allowKeys = map[string]bool{e: true}
			default:
				c.allowKeys[e] = true
			}
		}
		return nil
	}
}

// parseAllowNet reads an allow-list entry as an address or a prefix, or a key (no prefix, no error).
func parseAllowNet(e string) (netip.Prefix, error) {
	addr, bits, isPrefix := strings.Cut(e, "/")
	a, err := netip.ParseAddr(addr)
	switch {
	case err != nil && strings.Trim(e, "0123456789abcdefABCDEF.:/%[] ") == "":
		return netip.Prefix{}, fmt.Errorf("not an IP address or prefix: %w", err)
	case err != nil:
		return netip.Prefix{}, nil // a key
	case !isPrefix:
		a = a.Unmap().WithZone("")
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(e)
	switch {
	case err != nil:
		return netip.Prefix{}, err
	case a.Is4In6() && p.Bits() < 96:
		return netip.Prefix{}, fmt.Errorf("an IPv4-mapped prefix shorter than /96 (%s)", bits)
	case a.Is4In6(): // clients' addresses are unmapped: so is the prefix
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// allowedResolved reports whether r is allowed, and whether that is known before the key functions run.
func (c *config) allowedResolved(r *http.Request) (allowed, known bool) {
	if len(c.allowNets) == 0 {
		return false, true
	}
	a, ok := keyfuncs.ClientAddr(r.Context())
	return ok && c.allowedAddr(a), ok
}

func (c *config) allowedAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	return slices.ContainsFunc(c.allowNets, func(n netip.Prefix) bool { return n.Contains(a) })
}

func peerAddr(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr()
	}
	a, _ := netip.ParseAddr(r.RemoteAddr)
	return a
}
