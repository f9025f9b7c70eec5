package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/lua"
)

// DefaultKeyPrefix is the prefix of every Redis key a [Redis] store writes,
// unless [WithKeyPrefix] says otherwise.
const DefaultKeyPrefix = "tollgate:"

// Redis is a [Store] that keeps buckets in Redis, so that every server of an
// application shares one limit. Each Take is one EVALSHA of [lua.TokenBucket]
// (one round trip, atomic, on Redis's clock); when Redis does not have the
// script cached, the same call is retried once as EVAL, which caches it.
//
// The Redis key of a bucket is the prefix followed by the caller's key; keys
// longer than 128 bytes are replaced by their SHA-256 (keeping a Cluster
// hash tag). Every key carries a TTL equal to the time until its bucket is
// full again. Buckets are lost when Redis loses its data (a restart without
// persistence): they start full again.
//
// Redis works with any [redis.UniversalClient]: a single node, Sentinel
// ([redis.NewFailoverClient]), Cluster and Ring. It is safe for concurrent
// use; its zero value is not usable, call [NewRedis].
type Redis struct {
	client redis.Scripter
	prefix string
	// ctxDeadlines is true when the client's socket I/O ends at the
	// context's deadline (ContextTimeoutEnabled); otherwise Take enforces it.
	ctxDeadlines bool
	// cluster is the client when it is a Cluster client: see take.
	cluster *redis.ClusterClient
}

var errNilClient = errors.New("NewRedis was given a nil client")

// RedisOption configures a [Redis] store.
type RedisOption func(*Redis)

// WithKeyPrefix sets the prefix of the store's Redis keys (default
// [DefaultKeyPrefix]). It is used as it is, so end it with a separator
// ("myapp:"). Stores with different prefixes never share a bucket.
func WithKeyPrefix(prefix string) RedisOption {
	return func(r *Redis) { r.prefix = prefix }
}

// NewRedis returns a Redis store that runs its script through client.
func NewRedis(client redis.UniversalClient, opts ...RedisOption) *Redis {
	r := &Redis{prefix: DefaultKeyPrefix}
	if client != nil { // a nil client is an error from every Take, not a panic
		r.client, r.ctxDeadlines = client, honorsDeadlines(client)
		r.cluster, _ = client.(*redis.ClusterClient)
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Take implements [Store]. A Redis error, or ctx ending first, is returned
// wrapped; the decision is then the caller's (its failure policy).
//
// Take returns by ctx's deadline even when the client was built without
// ContextTimeoutEnabled (go-redis then bounds socket reads by ReadTimeout
// only): it waits for the call in another goroutine, which costs about a
// microsecond and finishes on its own by the client's timeouts. Set
// ContextTimeoutEnabled: true on the client to avoid that.
func (r *Redis) Take(ctx context.Context, key string, limit Limit, cost int) (Result, error) {
	p, err := limit.params()
	if err != nil {
		return Result{}, err
	}
	if cost < 0 || cost > limit.Burst {
		return Result{}, costError(key, limit, cost)
	}
	if _, ok := ctx.Deadline(); ok && !r.ctxDeadlines {
		return r.takeBounded(ctx, key, p, limit, cost)
	}
	return r.take(ctx, key, &p, limit, cost)
}

type takeResult struct {
	res Result
	err error
}

// takeBounded runs take and returns when it does or when ctx ends.
func (r *Redis) takeBounded(ctx context.Context, key string, p params, limit Limit, cost int) (Result, error) {
	done := make(chan takeResult, 1) // buffered: the call may finish after we stop waiting
	go func() {
		// A panic here (a client's hook, say) would end the process: no
		// handler can recover it on this goroutine. Return it as an error.
		defer func() {
			if v := recover(); v != nil {
				done <- takeResult{err: fmt.Errorf("store: take %q: panic: %v", key, v)}
			}
		}()
		res, err := r.take(ctx, key, &p, limit, cost)
		done <- takeResult{res, err}
	}()
	select {
	case tr := <-done:
		return tr.res, tr.err
	case <-ctx.Done():
		return Result{}, fmt.Errorf("store: take %q: %w", key, ctx.Err())
	}
}

func (r *Redis) take(ctx context.Context, key string, p *params, limit Limit, cost int) (Result, error) {
	if r.client == nil {
		return Result{}, fmt.Errorf("store: take %q: %w", key, errNilClient)
	}
	rkey := r.Key(key)
	keys := []string{rkey}
	args := []any{p.rate, p.period, p.burst, cost}
	reply, err := r.client.EvalSha(ctx, lua.TokenBucketSHA1, keys, args...).Result()
	if err != nil && isNoScript(err) {
		reply, err = r.client.Eval(ctx, lua.TokenBucket, keys, args...).Result()
	}
	if err != nil {
		var rerr redis.Error
		if r.cluster != nil && !errors.As(err, &rerr) {
			// A master that died answers no MOVED: go-redis would keep
			// sending its slots there until its slot map is 10s old. Ask
			// for a reload now (asynchronous, coalesced by go-redis), so
			// the slots follow the promoted replica as soon as it is up.
			r.cluster.ReloadState(ctx)
		}
		return Result{}, fmt.Errorf("store: take %q: %w", key, err)
	}
	res, err := parseReply(reply)
	if err != nil {
		return Result{}, fmt.Errorf("store: take %q: %w", key, err)
	}
	res.Limit = limit
	return res, nil
}

// Key returns the Redis key that holds the bucket named key.
func (r *Redis) Key(key string) string {
	if len(key) > maxKeyLen {
		key = hashKey(key)
	}
	return r.prefix + key
}

// honorsDeadlines reports whether client ends socket I/O at a context's
// deadline.
func honorsDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client: // also what NewFailoverClient returns
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// isNoScript reports whether err says that Redis does not have the script.
// Redis answers "NOSCRIPT No matching script..."; proxies and managed
// services have been seen to reword or prefix it ("ERR NOSCRIPT ...",
// "... no matching script ..."), so the test is on the words, anywhere.
func isNoScript(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false // a network error: running EVAL would not help
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "noscript") || strings.Contains(msg, "no matching script")
}

func parseReply(reply any) (Result, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != 4 {
		return Result{}, fmt.Errorf("unexpected script reply %v", reply)
	}
	var n [4]int64
	for i := range n {
		if n[i], ok = v[i].(int64); !ok {
			return Result{}, fmt.Errorf("unexpected script reply %v", reply)
		}
	}
	return Result{
		Allowed:    n[0] == 1,
		Remaining:  int(n[1]),
		RetryAfter: time.Duration(n[2]) * time.Microsecond,
		ResetAfter: time.Duration(n[3]) * time.Microsecond,
	}, nil
}
