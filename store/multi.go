package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Request asks [MultiStore.TakeAll] for Cost tokens from bucket Key under Limit.
type Request struct {
	Key   string
	Limit Limit
	Cost  int
	// MaxDelay takes the tokens ahead of time, as [Delayer] does; the
	// requests all wait for the longest Delay.
	MaxDelay time.Duration
}

// MultiStore is a [Store] that decides several buckets at once, all or nothing,
// so a per-user limit is not spent by requests a global limit refused.
type MultiStore interface {
	Store
	// TakeAll takes reqs[i].Cost tokens from every bucket reqs[i].Key, or none,
	// and returns a Result per request, in order, all with the same Allowed. When
	// denied, each describes its bucket as it stands, RetryAfter until it holds
	// its cost (0 if it had room: the largest is when all could pass). An invalid
	// limit or cost, or a repeated key (of one kind: a bucket and a window
	// quota on a key are apart), is an error and takes nothing.
	TakeAll(ctx context.Context, reqs []Request) ([]Result, error)
}

// Refunder is a [Store] that can give tokens back, as when a response shows that
// a request should not have counted (a successful login, a server error).
type Refunder interface {
	// Refund gives tokens (0 <= tokens <= limit.Burst) back to the bucket named
	// key, never above capacity, and returns it as it then stands (Allowed true).
	// A window quota's count goes back in the window current when Refund
	// runs (on Redis, the one both clocks agree on, else nothing): give back
	// only what a Take of that window counted, as the middleware does.
	Refund(ctx context.Context, key string, limit Limit, tokens int) (Result, error)
}

// ErrDuplicateKey is wrapped by TakeAll's error when two requests name one bucket.
var ErrDuplicateKey = errors.New("duplicate key")

// checkRequests validates reqs and returns their params.
func checkRequests(reqs []Request, lc *limitCache) ([]params, error) {
	ps := make([]params, len(reqs))
	for i, q := range reqs {
		p, _, err := lc.units(q.Key, q.Limit, q.Cost, false)
		if err == nil {
			ps[i], err = p.extend(q.MaxDelay, false)
		}
		if err != nil {
			return nil, err
		}
		for j, o := range reqs[:i] {
			if o.Key == q.Key && ps[j].spec == ps[i].spec { // a bucket and a quota on a key are apart
				return nil, fmt.Errorf("store: take all: %w %q", ErrDuplicateKey, q.Key)
			}
		}
	}
	return ps, nil
}
