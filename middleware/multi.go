package middleware

import (
	"net/http"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// Policy is one limit of a [Multi], such as 10/s and 1000/h per user, 100/s per route, 5000/s for all.
type Policy struct {
	// Name, unique in its tier, names buckets and RateLimit item ([WithName], no '/'); "": [DefaultName].
	Name  string
	Limit store.Limit
	// Key finds the subject: nil means [WithKeyFunc]'s; a global limit uses keyfuncs.Static.
	Key keyfuncs.KeyFunc
}

// Tiers gives each request its tier's policies (its plan, its API key): plans change without a rebuild.
type Tiers struct {
	Of      func(r *http.Request) string // the request's tier; one not in Plans (or "") is Default
	Plans   map[string][]Policy          // the policies of each tier
	Default string                       // one of Plans, for unknown tiers: the strictest plan
}

// Multi is rate-limiting middleware deciding several limits per request at once, all or nothing: a
// request refused by one policy consumes from none ([store.MultiStore]). It is safe for concurrent
// use; build it with [NewMulti] or [NewTiered].
//
// Each policy has an item in the RateLimit fields; the single-value fields report the tightest, and a
// 429's Retry-After, problem document and denied handler are those of the violated policy that
// frees last. A bucket is "[<tier>/]<name>:{<subject>}": one Redis Cluster slot and one script call
// ([store.Redis.TakeAll]) for a subject's policies. Options apply to every policy; [WithName] names
// the middleware in errors and logs; [WithDenyCache] needs plans of one policy.
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
