package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
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

// Tiers gives each request its policies, chosen by a function of the
// request (its plan, its API key), so that plans change without rebuilding
// the middleware.
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
// violated policy that frees last. A policy's bucket is "<name>:{<subject>}"
// (or "<tier>/<name>:{<subject>}"), so the policies of one subject share a
// Redis Cluster hash tag and one atomic script call; policies on other
// subjects are further calls (see [store.Redis.TakeAll]).
//
// The Options of [New] apply to every policy. [WithName] names the
// middleware in errors and logs; [WithDenyCache] is an error unless every
// plan has one policy.
type Multi struct{ *Limiter }

// NewMulti returns middleware that enforces every one of policies on each
// request, on a [store.MultiStore].
func NewMulti(s store.Store, policies []Policy, opts ...Option) (*Multi, error) {
	return NewTiered(s, Tiers{Plans: map[string][]Policy{"": policies}}, opts...)
}

// NewTiered returns middleware that enforces on each request the policies
// of its tier.
func NewTiered(s store.Store, t Tiers, opts ...Option) (*Multi, error) {
	if _, ok := s.(store.MultiStore); !ok && s != nil {
		return nil, fmt.Errorf("middleware: %T cannot decide several limits at once (store.MultiStore)", s)
	}
	defPlan, ok := t.Plans[t.Default]
	if !ok || len(defPlan) == 0 {
		return nil, fmt.Errorf("middleware: Tiers: the default tier %q has no policies", t.Default)
	}
	if len(t.Plans) > 1 && t.Of == nil {
		return nil, errors.New("middleware: Tiers: several plans but no Of function")
	}
	l, err := newLimiter(s, defPlan[0].Limit, opts)
	if err != nil {
		return nil, err
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
			q, err := l.policyOf(tier, pol)
			if err != nil {
				return nil, err
			}
			if slices.ContainsFunc(ps, func(o policy) bool { return o.name == q.name }) {
				return nil, fmt.Errorf("middleware: tier %q: two policies named %q", tier, q.name)
			}
			ps = append(ps, q)
		}
		l.plans[tier] = newPlan(ps...)
	}
	l.def = l.plans[t.Default]
	return &Multi{l}, nil
}

func (l *Limiter) policyOf(tier string, p Policy) (policy, error) {
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
