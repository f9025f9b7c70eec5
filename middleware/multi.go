package middleware

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// Policy is one of the limits a [Multi] enforces on a request: 10/s and
// 1000/h per user, 100/s per route, 5000/s for everyone.
type Policy struct {
	// Name names the policy's buckets and its item in the RateLimit
	// headers, unique within a tier, under the rules of [WithName] (and
	// without '/'); empty means [DefaultName] of Limit.
	Name  string
	Limit store.Limit
	// Key finds the policy's subject; nil means the limiter's key
	// function ([WithKeyFunc]). A global limit uses keyfuncs.Static.
	Key keyfuncs.KeyFunc
}

// Tiers gives each request the policies of its tier (its plan, its API
// key), so that plans change without rebuilding the middleware.
type Tiers struct {
	// Of returns the request's tier; one not in Plans (including "") is
	// the Default tier.
	Of func(r *http.Request) string
	// Plans are the policies of each tier.
	Plans map[string][]Policy
	// Default, one of Plans, is the tier of requests whose tier is unknown:
	// give it the strictest plan.
	Default string
}

// Multi is rate-limiting middleware that decides several limits per
// request at once, all or nothing: a request refused by one policy
// consumes from none (see [store.MultiStore]). It is safe for concurrent
// use; build it with [NewMulti] or [NewTiered].
//
// Every policy has its item in the RateLimit / RateLimit-Policy fields; the
// single-value RateLimit-Limit/-Remaining/-Reset report the first, and a
// 429's Retry-After, problem document and denied handler are those of the
// violated policy that frees last. A policy's bucket is
// "[<tier>/]<name>:{<subject>}", so the policies of one subject share a
// Redis Cluster hash tag and one script call (see [store.Redis.TakeAll]).
//
// The Options of [New] apply to every policy; [WithName] names the
// middleware in errors and logs; [WithDenyCache] needs plans of one policy.
type Multi struct{ *Limiter }

// NewMulti returns middleware that enforces every one of policies on each
// request, on a [store.MultiStore].
func NewMulti(s store.Store, policies []Policy, opts ...Option) (*Multi, error) {
	return NewTiered(s, Tiers{Plans: map[string][]Policy{"": policies}}, opts...)
}

// NewTiered returns middleware that enforces on each request the policies
// of its tier.
func NewTiered(s store.Store, t Tiers, opts ...Option) (*Multi, error) {
	l, err := newLimiter(s, t, opts, true)
	if err != nil {
		return nil, err
	}
	return &Multi{l}, nil
}

func (l *Limiter) policyOf(tier string, p Policy, tagged bool) (policy, error) {
	if !tagged {
		return l.newPolicy("", l.cfg.name, p.Limit, l.cfg.keyFunc, false)
	}
	if err := p.Limit.Validate(); err != nil {
		return policy{}, fmt.Errorf("middleware: tier %q: %w", tier, err)
	}
	name := p.Name
	if name == "" {
		name = DefaultName(p.Limit) + "@" + l.site
	}
	if err := checkName("WithName", name); err != nil {
		return policy{}, fmt.Errorf("middleware: tier %q: policy: %w", tier, err)
	}
	if strings.Contains(name, "/") {
		return policy{}, fmt.Errorf("middleware: tier %q: policy %q: '/' is not allowed (it separates tier and policy)", tier, name)
	}
	key := p.Key
	if key == nil {
		key = l.cfg.keyFunc
	}
	return l.newPolicy(tier, name, p.Limit, key, true)
}
