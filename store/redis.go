package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
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
// (one round trip, atomic, on Redis's clock), unless [WithCoalescing] lets
// concurrent Takes of one bucket share one; when Redis does not have the
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
	optErr error // the first unusable option, for Validate
	// pipelines is the number of pipelines in flight per node when
	// batching (0: no batching); see WithBatching.
	pipelines int
	// coalesce lets the Takes of one bucket in a pipeline share a script
	// call; see WithCoalescing.
	coalesce bool
	single1  *batcher // the batcher of a client that is not a Cluster
	nodes    sync.Map // *redis.Client (a Cluster master) → *batcher
	boxed    atomic.Pointer[boxed]
	// ctxDeadlines is true when the client's socket I/O ends at the
	// context's deadline (ContextTimeoutEnabled); otherwise Take enforces it.
	ctxDeadlines bool
	// cluster is the client when it is a Cluster client: see take.
	cluster *redis.ClusterClient
	// slotsLoaded is true once the Cluster client has answered a slot
	// lookup: see masterFor.
	slotsLoaded atomic.Bool
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
// With batching, concurrent Takes are pipelined: a Take is sent at once if
// fewer than n pipelines are in flight — alone at low load, so batching
// adds no linger — and otherwise leaves with the next pipeline, together
// with every Take queued meanwhile (at most 128), each Take still one
// EVALSHA of its own and answered on its own. On a Cluster, Takes are
// batched per master (a slow node holds up only its own keys) and a Take
// that the node redirects (MOVED, ASK) is retried alone through the Cluster
// client. On a Ring, the Ring splits each pipeline among its shards. Client
// hooks see pipelines rather than single commands.
//
// A negative n is an error that [Redis.Validate] reports (and
// middleware.New refuses); the store keeps the default.
func WithBatching(n int) RedisOption {
	return func(r *Redis) {
		if n < 0 {
			if r.optErr == nil {
				r.optErr = fmt.Errorf("store: WithBatching(%d): the number of pipelines must be 0 (off) or more", n)
			}
			return
		}
		r.pipelines = n
	}
}

// WithCoalescing, on, lets the Takes of one bucket that leave in one
// pipeline (see [WithBatching]) share one EVALSHA of their summed cost (at
// most the bucket's capacity), so that a hot key costs Redis one script
// call per pipeline rather than one per Take. It is off by default: every
// Take is then one EVALSHA, in one round trip.
//
// Coalesced Takes share a bucket, a limit and a cost, and each is answered
// on its own with what it would have got alone at that instant: when the
// call is allowed, every Take it carried is, and those beyond the bucket's
// capacity are denied; when it is denied while the first m Takes would
// have been allowed in turn, those m are sent again, one by one, in a
// second pipeline (they take two round trips), and the rest are denied as
// after them. Redis then counts fewer EVALSHAs than decisions. Without
// batching, it has no effect.
func WithCoalescing(on bool) RedisOption {
	return func(r *Redis) { r.coalesce = on }
}

// Validate returns an error when the store cannot decide anything, because
// it was given a nil client (every Take then fails with that error), or
// when it was given an unusable option (such as WithBatching(-1), which it
// then ignores). middleware.New refuses such a store.
func (r *Redis) Validate() error {
	if r.client == nil {
		return fmt.Errorf("store: %w", errNilClient)
	}
	return r.optErr
}

func isNilClient(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// NewRedis returns a Redis store that runs its script through client.
func NewRedis(client redis.UniversalClient, opts ...RedisOption) *Redis {
	r := &Redis{prefix: DefaultKeyPrefix, pipelines: DefaultBatchPipelines}
	// A nil client, or a nil pointer in the interface, leaves r.client nil:
	// an error from every Take and from Validate, not a panic.
	if !isNilClient(client) {
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
// only): the call is then sent from another goroutine, which finishes on
// its own by the client's timeouts. Set ContextTimeoutEnabled: true on the
// client to save that hand-over.
func (r *Redis) Take(ctx context.Context, key string, limit Limit, cost int) (Result, error) {
	b, err := r.boxedArgs(limit)
	if err != nil {
		return Result{}, err
	}
	if cost < 0 || cost > limit.Burst {
		return Result{}, costError(key, limit, cost)
	}
	return r.one(ctx, key, b, limit, cost)
}

// Refund implements [Refunder] with the same script and a negative cost.
func (r *Redis) Refund(ctx context.Context, key string, limit Limit, tokens int) (Result, error) {
	b, err := r.boxedArgs(limit)
	if err != nil {
		return Result{}, err
	}
	if tokens < 0 || tokens > limit.Burst {
		return Result{}, refundError(key, limit, tokens)
	}
	return r.one(ctx, key, b, limit, -tokens)
}

// one runs the script for one key.
func (r *Redis) one(ctx context.Context, key string, b *boxed, limit Limit, cost int) (Result, error) {
	if r.client == nil {
		return Result{}, fmt.Errorf("store: take %q: %w", key, errNilClient)
	}
	c := r.takeCall(ctx, key, b, cost)
	err, abandoned := r.exec(ctx, c)
	if err != nil {
		if !abandoned {
			c.release()
		}
		return Result{}, err
	}
	res := c.res1[0]
	c.release()
	res.Limit = limit
	return res, nil
}

// takeCall returns the script call of a Take (a Refund when cost is
// negative) of cost tokens from key's bucket, under the limit of b.
func (r *Redis) takeCall(ctx context.Context, key string, b *boxed, cost int) *call {
	c := newCall(ctx, key)
	c.keys1[0] = r.Key(key)
	c.keys, c.res = c.keys1[:], c.res1[:]
	if b.oneKey {
		c.setOneKey(b.u, int64(cost))
		k := b.v[1] // cost 1
		if cost != 1 {
			k = c.k // boxing allocates unless it is below 256
		}
		c.args1[0], c.args1[1], c.args1[2] = b.v[0], k, b.v[2]
		c.args = c.args1[:b.n]
	} else {
		c.args1 = [4]any{b.v[0], b.v[1], b.v[2], cost}
		c.args = c.args1[:]
	}
	return c
}

// TakeAll implements [MultiStore]. Requests whose keys share a Cluster hash
// tag ("{user:42}" in "{user:42}:10/s" and "{user:42}:1000/h") are decided
// in one script call, atomically, on any client — the middleware names its
// keys so. Requests with different tags may live on different Cluster
// nodes or Ring shards, so each tag is a call of its own, in the order in
// which the tags first appear in reqs; when a later call is denied or
// fails, the tokens taken by the earlier calls are given back (a refund
// call), and the buckets of the tags not asked yet are read without taking.
// If that refund cannot be made (Redis failing between the calls), the
// earlier tokens stay taken, and the limit errs on the strict side, never
// the loose one. TakeAll returns by ctx's deadline: refunds still due then
// are made in the background (each call within 100 ms), and the buckets of
// the tags not asked are read only while ctx lasts (otherwise their Results
// hold only their Limit). On a single node or Sentinel client, all
// requests are one call whatever their keys.
func (r *Redis) TakeAll(ctx context.Context, reqs []Request) ([]Result, error) {
	ps, err := checkRequests(reqs)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	if r.client == nil {
		return nil, fmt.Errorf("store: take %q: %w", reqs[0].Key, errNilClient)
	}
	groups := r.groups(reqs)
	var taken [][]int
	for gi, g := range groups {
		if err := r.group(ctx, reqs, ps, g, out, 1); err != nil {
			r.giveBackBy(ctx, reqs, ps, taken, out)
			return nil, err
		}
		if out[g[0]].Allowed {
			taken = append(taken, g)
			continue
		}
		// Denied: give back what the earlier groups took, and read the
		// buckets of the groups not asked, by the caller's deadline. The
		// denial stands whatever happens to these calls.
		r.giveBackBy(ctx, reqs, ps, taken, out)
		for _, rest := range groups[gi+1:] {
			for _, i := range rest {
				out[i] = Result{Limit: reqs[i].Limit}
			}
			if ctx.Err() == nil {
				r.group(ctx, reqs, ps, rest, out, 0)
			}
			for _, i := range rest {
				// Read, not asked: when would this bucket hold its cost?
				full := time.Duration(ps[i].times(ps[i].burst-int64(reqs[i].Cost)).ceil()) * time.Microsecond
				out[i].RetryAfter = max(out[i].ResetAfter-full, 0)
			}
		}
		for i := range out {
			out[i].Allowed = false
		}
		return out, nil
	}
	return out, nil
}

// giveBackTimeout bounds each refund that follows a denial by a later group
// of a TakeAll: refunds run even when the caller's deadline has passed.
const giveBackTimeout = 100 * time.Millisecond

// afterDenial runs f under its own short deadline, not the caller's.
func (r *Redis) afterDenial(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	return f(ctx)
}

// groups splits reqs by hash tag (one group for a client that is neither
// Cluster nor Ring), keeping the order of first appearance.
func (r *Redis) groups(reqs []Request) [][]int {
	_, ring := r.client.(*redis.Ring)
	if r.cluster == nil && !ring {
		all := make([]int, len(reqs))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	var groups [][]int
	var tags []string
	for i, q := range reqs {
		tag := groupTag(r.Key(q.Key))
		j := slices.Index(tags, tag)
		if j < 0 {
			tags, groups = append(tags, tag), append(groups, nil)
			j = len(groups) - 1
		}
		groups[j] = append(groups[j], i)
	}
	return groups
}

// group runs one script call for the requests at indexes g, with their
// costs multiplied by sign (1: take, 0: read, -1: give back), and writes
// their Results into out.
func (r *Redis) group(ctx context.Context, reqs []Request, ps []params, g []int, out []Result, sign int) error {
	c := newCall(ctx, reqs[g[0]].Key)
	if i := g[0]; len(g) == 1 {
		if u, ok := ps[i].units(); ok {
			cost := int64(sign * reqs[i].Cost)
			c.keys = []string{r.Key(reqs[i].Key)}
			c.args = oneKeyArgs(u, cost)
			c.res = make([]Result, 1)
			c.setOneKey(u, cost)
			return r.finish(ctx, c, reqs, g, out)
		}
	}
	c.keys = make([]string, len(g))
	c.args = make([]any, 0, 4*len(g))
	c.res = make([]Result, len(g))
	for j, i := range g {
		c.keys[j] = r.Key(reqs[i].Key)
		c.args = append(c.args, ps[i].rate, ps[i].period, ps[i].burst, sign*reqs[i].Cost)
	}
	return r.finish(ctx, c, reqs, g, out)
}

// finish runs group's call c and fills in the results of its requests.
func (r *Redis) finish(ctx context.Context, c *call, reqs []Request, g []int, out []Result) error {
	err, abandoned := r.exec(ctx, c)
	if err == nil {
		for j, i := range g {
			out[i] = c.res[j]
			out[i].Limit = reqs[i].Limit
		}
	}
	if !abandoned {
		c.release()
	}
	return err
}

// giveBackBy refunds the tokens the groups in taken took, on another
// goroutine, each call under its own short deadline (see afterDenial): the
// refunds are made even when the caller's deadline passes first. It
// returns when they are done, and then writes the buckets as they stand
// into out, or when ctx ends, leaving out as it is (those buckets then read
// emptier than they are, by what the refunds give back).
func (r *Redis) giveBackBy(ctx context.Context, reqs []Request, ps []params, taken [][]int, out []Result) {
	if len(taken) == 0 {
		return
	}
	after := make([]Result, len(out))
	given := make(chan int, 1)
	reqs = slices.Clone(reqs) // the caller may reuse its slice once TakeAll returns
	go func() {
		n := 0
		for _, g := range taken {
			err := r.afterDenial(ctx, func(ctx context.Context) error { return r.group(ctx, reqs, ps, g, after, -1) })
			if err != nil {
				break // the rest stay taken: strict, never loose
			}
			n++
		}
		given <- n
	}()
	select {
	case n := <-given:
		for _, g := range taken[:n] {
			for _, i := range g {
				out[i] = after[i]
			}
		}
	case <-ctx.Done():
	}
}

// exec runs c: through the batcher of its node, or alone. abandoned is true
// when ctx ended while another goroutine still holds c.
func (r *Redis) exec(ctx context.Context, c *call) (err error, abandoned bool) {
	_, deadline := ctx.Deadline()
	direct := r.ctxDeadlines || !deadline
	if r.pipelines > 0 {
		b := r.single1
		if r.cluster != nil {
			node, err := r.masterFor(ctx, c.keys[0], direct)
			if err != nil { // no slot map yet, or no master for the slot
				if ctx.Err() != nil {
					return fmt.Errorf("store: take %q: %w", c.key, ctx.Err()), false
				}
				return r.bounded(ctx, c, direct)
			}
			b = r.nodeBatcher(node)
		}
		return b.do(ctx, c, direct)
	}
	return r.bounded(ctx, c, direct)
}

// masterFor returns the Cluster master that serves key. Until the Cluster
// client has loaded its slot map, a lookup asks a node for it, which waits
// for the client's own timeouts rather than ctx's deadline unless direct:
// such a lookup runs on another goroutine, and masterFor returns when ctx
// ends. Once the map is loaded, lookups read it and never wait.
func (r *Redis) masterFor(ctx context.Context, key string, direct bool) (*redis.Client, error) {
	if direct || r.slotsLoaded.Load() {
		return r.cluster.MasterForKey(ctx, key)
	}
	type answer struct {
		node *redis.Client
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		node, err := r.cluster.MasterForKey(context.WithoutCancel(ctx), key)
		if err == nil {
			r.slotsLoaded.Store(true)
		}
		ch <- answer{node, err}
	}()
	select {
	case a := <-ch:
		return a.node, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// bounded runs c on this goroutine when direct, else on another one, and
// returns when it is done or ctx ends.
func (r *Redis) bounded(ctx context.Context, c *call, direct bool) (err error, abandoned bool) {
	if direct {
		return r.run(ctx, c), false
	}
	go func() {
		// A panic here (a client's hook, say) would end the process: no
		// handler can recover it on this goroutine. Return it as an error,
		// and answer too when a hook ends the goroutine with
		// runtime.Goexit (recover then returns nil).
		answered := false
		defer func() {
			if v := recover(); v != nil {
				c.answer(fmt.Errorf("store: take %q: panic: %v", c.key, v))
			} else if !answered {
				c.answer(fmt.Errorf("store: take %q: %w", c.key, errGoexit))
			}
		}()
		c.answer(r.run(ctx, c))
		answered = true
	}()
	return c.wait(ctx)
}

// run sends c's script call on this goroutine (EVALSHA, then EVAL on
// NOSCRIPT) and fills in c.res.
func (r *Redis) run(ctx context.Context, c *call) error {
	reply, err := r.client.EvalSha(ctx, lua.TokenBucketSHA1, c.keys, c.args...).Result()
	if err != nil && isNoScript(err) {
		reply, err = r.client.Eval(ctx, lua.TokenBucket, c.keys, c.args...).Result()
	}
	if err != nil {
		r.failed(ctx, err)
		return fmt.Errorf("store: take %q: %w", c.key, err)
	}
	if err := c.parse(reply); err != nil {
		return fmt.Errorf("store: take %q: %w", c.key, err)
	}
	return nil
}

// boxedArgs returns the script's arguments for limit as interface values,
// or why limit is invalid. They are kept from the previous call when the
// Limit is the same: a Take then neither validates it again nor boxes
// integers (boxing one above 255 allocates).
func (r *Redis) boxedArgs(limit Limit) (*boxed, error) {
	if b := r.boxed.Load(); b != nil && b.l == limit {
		return b, nil
	}
	p, err := limit.params()
	if err != nil {
		return nil, err
	}
	b := &boxed{l: limit, v: [3]any{p.rate, p.period, p.burst}}
	if u, ok := p.units(); ok {
		b.oneKey, b.u, b.v = true, u, [3]any{}
		b.n = copy(b.v[:], oneKeyArgs(u, 1))
	}
	r.boxed.Store(b)
	return b, nil
}

// boxed holds the arguments of a valid Limit: of the one-key form (cap, k
// for cost 1, and q unless it is 1: n of them) when oneKey, else the general
// form's rate, period and burst.
type boxed struct {
	l      Limit
	oneKey bool
	u      units
	n      int
	v      [3]any
}

// oneKeyArgs returns the one-key form's arguments for a decision of cost
// tokens (lua/tokenbucket.lua).
func oneKeyArgs(u units, cost int64) []any {
	if u.q == 1 {
		return []any{u.cap, cost * u.t}
	}
	return []any{u.cap, cost * u.t, u.q}
}

func (r *Redis) nodeBatcher(node *redis.Client) *batcher {
	if b, ok := r.nodes.Load(node); ok {
		return b.(*batcher)
	}
	b, _ := r.nodes.LoadOrStore(node, &batcher{r: r, client: node, max: r.pipelines})
	return b.(*batcher)
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

// parse reads the script's reply to c into c.res.
func (c *call) parse(reply any) error {
	if !c.oneKey {
		return parseReply(reply, c.res)
	}
	if n, ok := reply.(int64); ok {
		if res, ok := c.u.result(n, c.k); ok {
			c.res[0] = res
			return nil
		}
	}
	return fmt.Errorf("unexpected script reply %v", reply)
}

// parseReply reads the general form's reply, 4 integers per key, into dst.
func parseReply(reply any, dst []Result) error {
	v, ok := reply.([]any)
	if !ok || len(v) != 4*len(dst) {
		return fmt.Errorf("unexpected script reply %v", reply)
	}
	for i := range dst {
		var n [4]int64
		for j := range n {
			if n[j], ok = v[4*i+j].(int64); !ok {
				return fmt.Errorf("unexpected script reply %v", reply)
			}
		}
		dst[i] = Result{
			Allowed:    n[0] == 1,
			Remaining:  int(n[1]),
			RetryAfter: time.Duration(n[2]) * time.Microsecond,
			ResetAfter: time.Duration(n[3]) * time.Microsecond,
		}
	}
	return nil
}

// groupTag returns the part of key that decides its Cluster slot or Ring
// shard: its hash tag, else the whole key.
func groupTag(key string) string {
	if tag, ok := hashTag(key); ok {
		return tag
	}
	return key
}
