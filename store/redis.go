package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
// Concurrent Takes are batched (see [WithBatching]): under load, the calls
// queued while the previous pipelines were in flight leave together in one
// pipelined write; at low load a call leaves at once, alone. Batching never
// starts a goroutine that outlives the calls it serves.
//
// Redis works with any [redis.UniversalClient]: a single node, Sentinel
// ([redis.NewFailoverClient]), Cluster and Ring. It is safe for concurrent
// use; its zero value is not usable, call [NewRedis].
type Redis struct {
	client redis.UniversalClient
	prefix string
	// pipelines is the number of pipelines in flight per node when
	// batching (0: no batching); see WithBatching.
	pipelines int
	single1   *batcher // the batcher of a client that is not a Cluster
	nodes     sync.Map // *redis.Client (a Cluster master) → *batcher
	boxed     atomic.Pointer[boxed]
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

// WithBatching sets how many pipelines the store keeps in flight per Redis
// node (default [DefaultBatchPipelines]); 0 turns batching off, so that
// every Take is a call of its own on the client's pool.
//
// With batching, concurrent Takes are coalesced: a Take is sent at once if
// fewer than n pipelines are in flight — alone at low load, so batching
// adds no linger — and otherwise leaves with the next pipeline, together
// with every Take queued meanwhile (at most 128). Each Take is still one
// EVALSHA and is answered on its own. On a Cluster, Takes are batched per
// master (a slow node holds up only its own keys) and a Take that the node
// redirects (MOVED, ASK) is retried alone through the Cluster client. On a
// Ring, the Ring splits each pipeline among its shards. Client hooks see
// pipelines rather than single commands.
func WithBatching(n int) RedisOption {
	return func(r *Redis) { r.pipelines = max(n, 0) }
}

// NewRedis returns a Redis store that runs its script through client.
func NewRedis(client redis.UniversalClient, opts ...RedisOption) *Redis {
	r := &Redis{prefix: DefaultKeyPrefix, pipelines: DefaultBatchPipelines}
	if client != nil { // a nil client is an error from every Take, not a panic
		r.client, r.ctxDeadlines = client, honorsDeadlines(client)
		r.cluster, _ = client.(*redis.ClusterClient)
	}
	for _, o := range opts {
		if o != nil {
			o(r)
		}
	}
	if r.client != nil && r.cluster == nil {
		r.single1 = &batcher{r: r, client: r.client, max: r.pipelines}
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
	if r.pipelines > 0 && r.client != nil {
		return r.takeBatched(ctx, key, &p, limit, cost)
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
	v := r.boxedParams(p)
	res, err := r.single(ctx, key, r.Key(key), []any{v[0], v[1], v[2], cost})
	res.Limit = limit
	return res, err
}

// takeBatched queues the call on the batcher of the key's node.
func (r *Redis) takeBatched(ctx context.Context, key string, p *params, limit Limit, cost int) (Result, error) {
	rkey := r.Key(key)
	b := r.single1
	if r.cluster != nil {
		node, err := r.cluster.MasterForKey(ctx, rkey)
		if err != nil { // no slot map yet, or no master for the slot
			return r.take(ctx, key, p, limit, cost)
		}
		b = r.nodeBatcher(node)
	}
	c := callPool.Get().(*call)
	c.ctx, c.key, c.rkey, c.keys[0] = ctx, key, rkey, rkey
	v := r.boxedParams(p)
	c.args = [4]any{v[0], v[1], v[2], cost}
	_, deadline := ctx.Deadline()
	res, err := b.do(ctx, c, r.ctxDeadlines || !deadline)
	if err != nil {
		return Result{}, err
	}
	res.Limit = limit
	return res, nil
}

// boxedParams returns the script's first three arguments for p as
// interface values, kept from the previous call when the limit is the same:
// boxing integers above 255 allocates.
func (r *Redis) boxedParams(p *params) *[3]any {
	if b := r.boxed.Load(); b != nil && b.p == *p {
		return &b.v
	}
	b := &boxed{p: *p, v: [3]any{p.rate, p.period, p.burst}}
	r.boxed.Store(b)
	return &b.v
}

type boxed struct {
	p params
	v [3]any
}

func (r *Redis) nodeBatcher(node *redis.Client) *batcher {
	if b, ok := r.nodes.Load(node); ok {
		return b.(*batcher)
	}
	b, _ := r.nodes.LoadOrStore(node, &batcher{r: r, client: node, max: r.pipelines})
	return b.(*batcher)
}

// single runs one script call for rkey, falling back to EVAL on NOSCRIPT.
func (r *Redis) single(ctx context.Context, key, rkey string, args []any) (Result, error) {
	keys := []string{rkey}
	reply, err := r.client.EvalSha(ctx, lua.TokenBucketSHA1, keys, args...).Result()
	if err != nil && isNoScript(err) {
		reply, err = r.client.Eval(ctx, lua.TokenBucket, keys, args...).Result()
	}
	if err != nil {
		r.failed(ctx, err)
		return Result{}, fmt.Errorf("store: take %q: %w", key, err)
	}
	res, err := parseReply(reply)
	if err != nil {
		return Result{}, fmt.Errorf("store: take %q: %w", key, err)
	}
	return res, nil
}

// failed reacts to a failed call: on a Cluster, a connection error asks
// the client to reload its slot map.
func (r *Redis) failed(ctx context.Context, err error) {
	var rerr redis.Error
	if r.cluster != nil && !errors.As(err, &rerr) {
		// A master that died answers no MOVED: go-redis would keep
		// sending its slots there until its slot map is 10s old. Ask
		// for a reload now (asynchronous, coalesced by go-redis), so
		// the slots follow the promoted replica as soon as it is up.
		r.cluster.ReloadState(ctx)
	}
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
