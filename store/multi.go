package store

import (
	"context"
	"errors"
	"fmt"
)

// Request is one bucket of a [MultiStore.TakeAll]: Cost tokens from the
// bucket named Key under Limit.
type Request struct {
	Key   string
	Limit Limit
	Cost  int
}

// MultiStore is a [Store] that decides several buckets at once, all or
// nothing: either every request's tokens are taken, or none is. A request
// denied by any limit consumes from none, so a per-user limit is not spent
// by requests that a global limit refused. [Memory] and [Redis] implement
// it; middleware uses it when a store does.
type MultiStore interface {
	Store
	// TakeAll takes reqs[i].Cost tokens from every bucket reqs[i].Key, or
	// none. It returns one Result per request, in order. Allowed is the
	// same in all of them: true when the tokens were taken. When they were
	// not, each Result still describes its bucket as it stands (Remaining
	// counts the tokens left without this request), and RetryAfter is the
	// time until that bucket holds its cost — zero for the buckets that
	// had room, so the largest RetryAfter is when the whole request could
	// pass. Keys must be distinct; an invalid limit, cost or a repeated key
	// is an error and takes nothing.
	TakeAll(ctx context.Context, reqs []Request) ([]Result, error)
}

// Refunder is a [Store] that can give tokens back, for example after the
// response showed that a request should not have counted (a successful
// login, a server error). [Memory] and [Redis] implement it.
type Refunder interface {
	// Refund gives tokens (0 <= tokens <= limit.Burst) back to the bucket
	// named key, never above its capacity, and returns the bucket as it
	// then stands (Allowed is true).
	Refund(ctx context.Context, key string, limit Limit, tokens int) (Result, error)
}

// ErrDuplicateKey is wrapped by the error TakeAll returns when two requests
// name the same bucket.
var ErrDuplicateKey = errors.New("duplicate key")

// checkRequests validates reqs and returns their parameters.
func checkRequests(reqs []Request, lc *limitCache) ([]*params, error) {
	ps := make([]*params, len(reqs))
	for i, q := range reqs {
		p, err := lc.get(q.Limit)
		if err != nil {
			return nil, err
		}
		if q.Cost < 0 || q.Cost > q.Limit.Burst {
			return nil, costError(q.Key, q.Limit, q.Cost)
		}
		for _, o := range reqs[:i] {
			if o.Key == q.Key {
				return nil, fmt.Errorf("store: take all: %w %q", ErrDuplicateKey, q.Key)
			}
		}
		ps[i] = p
	}
	return ps, nil
}

func costError(key string, limit Limit, cost int) error {
	return fmt.Errorf("store: take %q: %w: cost %d is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, cost, limit.Burst, limit)
}

func refundError(key string, limit Limit, tokens int) error {
	return fmt.Errorf("store: refund %q: %w: %d tokens is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, tokens, limit.Burst, limit)
}
