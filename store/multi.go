package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Request asks [MultiStore.TakeAll] for Cost tokens from bucket Key under
// Limit, taken up to MaxDelay ahead as [Delayer] does.
type Request struct {
	Key      string
	Limit    Limit
	Cost     int
	MaxDelay time.Duration
}

// MultiStore is a [Store] that decides several buckets at once, all or nothing,
// so a per-user limit is not spent by requests a global limit refused.
type MultiStore interface {
	Store
	// TakeAll takes every request's cost, or none, and returns their
	// Results in order, all with the same Allowed; denied, each RetryAfter
	// is until its bucket holds its cost (0: it had room). An invalid limit
	// or cost, or a bucket named twice ([ErrDuplicateKey]), is an error.
	TakeAll(ctx context.Context, reqs []Request) ([]Result, error)
}

// Refunder is a [Store] that can give tokens back, as when a response shows
// that a request should not have counted.
type Refunder interface {
	// Refund gives tokens (0 to Burst) back to key's bucket, never above
	// full, and returns it as it then stands (Allowed true). A window
	// quota's count goes back in the current window (on Redis, if both
	// clocks agree on it: a refund arriving late frees nothing of the next):
	// give back only what a Take of that window counted.
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
