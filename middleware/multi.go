package middleware

import (
	"net/http"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// Policy is one of the limits a [Multi] enforces on a request: 10/s and
// 1000/h per user, 100/s per route, 5000/s for everyone.
type Policy struct {
	// Name, unique in its tier, names the policy's buckets and RateLimit item
	// by the rules of [WithName], without '/'; empty means [DefaultName].
	Name  string
	Limit store.Limit
	// Key finds the subject: nil means [WithKeyFunc]'s; a global limit uses keyfuncs.Static.
	Key keyfuncs.KeyFunc
}

// Tiers gives each request the policies of its tier (its plan, its API
// key), so that plans change without rebuilding the middleware.
type Tiers struct {
	// Of returns the request's tier; one not in Plans (or "") is Default.
	Of func(r *http.Request) string
	// Plans are the policies of each tier.
	Plans map[string][]Policy
	// Default, one of Plans, is the tier of unknown tiers: the strictest plan.
	Default string
}

// Multi is rate-limiting middleware that decides several limits per request
// at once, all or nothing: a request refused by one policy consumes from
// none (see [store.MultiStore]). It is safe for concurrent use; build it
// with [NewMulti] or [NewTiered].
//
// Each policy has its item in the RateLimit and RateLimit-Policy fields; the
// single-value fields report the first, and a 429's Retry-After, problem
// document and denied handler are those of the violated policy that frees
// last. A bucket is "[<tier>/]<name>:{<subject>}": one Redis Cluster slot
// and one script call ([store.Redis.TakeAll]) for a subject's policies.
// Options apply to every policy; [WithName] names the middleware in errors
// and logs; [WithDenyCache] needs plans of one policy.
type Multi struct{ *Limiter }

// NewMulti returns middleware enforcing all of policies on each request, on a [store.MultiStore].
func NewMulti(s store.Store, policies []Policy, opts ...Option) (*Multi, error) {
	return NewTiered(s, Tiers{Plans: map[string][]Policy{"": policies}}, opts...)
}

// NewTiered returns middleware enforcing on each request its tier's policies.
func NewTiered(s store.Store, t Tiers, opts ...Option) (*Multi, error) {
	l, err := newLimiter(s, t, opts, true)
	if err != nil {
		return nil, err
	}
	return &Multi{l}, nil
}
