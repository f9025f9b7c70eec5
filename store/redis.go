package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/lua"
)

// DefaultKeyPrefix is the key prefix of a [Redis] store without [WithKeyPrefix].
const DefaultKeyPrefix = "tollgate:"

// Redis is a [Store] that keeps buckets in Redis, shared by every server of an
// application: each Take is one EVALSHA of [lua.TokenBucket] (atomic, on
// Redis's clock; EVAL if Redis lacks the script), batched with concurrent
// ones; a restart without persistence refills every bucket. It takes a
// go-redis Client (single node or Sentinel), ClusterClient or Ring with
// ContextTimeoutEnabled (and no ReadTimeout or WriteTimeout of -2, which
// turns deadlines off), and is safe for concurrent use. Call [NewRedis].
// If the client retries (MaxRetries), a call ends once its reply is later
// than the client's ReadTimeout or WriteTimeout (a call that cannot be
// canceled, as under Background, from 15/16 of that): a copy sent then
// would be taken too.
type Redis struct {
	client    redis.UniversalClient
	cluster   *redis.ClusterClient // client, if a Cluster client
	tagged    bool                 // Cluster or Ring: keys carry a hash tag
	prefix    string
	pipelines int
	err       error // the first unusable option, for Validate
	limits    limitCache
	single    *batcher // not a Cluster's
	nodes     sync.Map // *redis.Client (a Cluster master) → *batcher
	clock     func() time.Time
	late      *Budget // nil, or how late a reply may be before go-redis sends the call again
}

// DefaultBatchPipelines is [WithBatching]'s default: pipelines in flight per node.
const DefaultBatchPipelines = 2

var errNilClient = errors.New("NewRedis was given a nil client")

// RedisOption configures a [Redis] store.
type RedisOption func(*Redis)

// WithKeyPrefix sets the key prefix (default [DefaultKeyPrefix]), used as is:
// end it with a separator ("myapp:"). On a Cluster or Ring a prefix with a
// brace, which would pick every key's slot, is an error for [Redis.Validate].
func WithKeyPrefix(prefix string) RedisOption {
	return func(r *Redis) {
		switch {
		case !r.tagged || !strings.ContainsAny(prefix, "{}"):
			r.prefix = prefix
		case r.err == nil:
			r.err = fmt.Errorf("store: WithKeyPrefix(%q) on a Cluster or Ring: a brace would choose the hash slot of every key; the store sets each key's hash tag itself", prefix)
		}
	}
}

// WithBatching sets the pipelines in flight per Redis node (default
// [DefaultBatchPipelines]; 0: off; below 0: an error for [Redis.Validate]).
// Below n in flight a Take goes out alone at once, else with up to 127 others
// queued meanwhile, in one pipeline of an EVALSHA per hash tag, each Take
// decided on its own. Behind a proxy that shards a single node's keys
// (twemproxy, Envoy), use a Ring or Cluster client, or 0.
func WithBatching(n int) RedisOption {
	return func(r *Redis) {
		if n >= 0 {
			r.pipelines = n
		} else if r.err == nil {
			r.err = fmt.Errorf("store: WithBatching(%d): the number of pipelines must be 0 (off) or more", n)
		}
	}
}

// WithWindowClock sets the clock around which calendar windows are computed
// (default time.Now; nil is ignored), for tests on miniredis; windows from
// the epoch follow Redis's TIME (miniredis's SetTime).
func WithWindowClock(now func() time.Time) RedisOption {
	return func(r *Redis) {
		if now != nil {
			r.clock = now
		}
	}
}

// NewRedis returns a Redis store that runs its script through client.
func NewRedis(client redis.UniversalClient, opts ...RedisOption) *Redis {
	r := &Redis{prefix: DefaultKeyPrefix, pipelines: DefaultBatchPipelines, client: client, clock: time.Now}
	switch c := client.(type) {
	case *redis.ClusterClient:
		r.cluster, r.tagged = c, true
	case *redis.Ring:
		r.tagged = true
	}
	if client == (*redis.Client)(nil) || client == (*redis.ClusterClient)(nil) || client == (*redis.Ring)(nil) {
		r.client = nil // a nil pointer is no client: an error, never a panic
	}
	for _, o := range opts {
		if o != nil {
			o(r)
		}
	}
	r.single = &batcher{r: r, client: r.client}
	if late := lateAfter(r.client); late > 0 {
		r.late = NewBudget(late)
	}
	return r
}

// lateAfter returns how late a reply may be before c's retries (MaxRetries, a
// Cluster's MaxRedirects) would send the call again, or 0 if they never
// would. Redis runs every copy it receives, so a Take whose reply was late
// would be taken twice or more (4 times in TestRedisLateReplyTakenOnce); the
// store ends such a call then instead, and the failure policy decides.
func lateAfter(c redis.UniversalClient) time.Duration {
	var retries int
	var read, write time.Duration
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		retries, read, write = o.MaxRetries, o.ReadTimeout, o.WriteTimeout
	case *redis.ClusterClient:
		o := c.Options()
		retries, read, write = max(o.MaxRetries, o.MaxRedirects), o.ReadTimeout, o.WriteTimeout
	case *redis.Ring:
		o := c.Options()
		retries, read, write = o.MaxRetries, o.ReadTimeout, o.WriteTimeout
	}
	if retries <= 0 || read <= 0 && write <= 0 {
		return 0
	}
	if read <= 0 || write > 0 && write < read {
		return write
	}
	return read
}

// bound returns ctx, ending within r.late if the client would otherwise
// send a late call again: a ctx that cannot end (no Done, as Background)
// under r.late's shared deadline (a timer per call cost a Take alone 5 of
// its 13 allocations, one in a pipeline 1 of 3: go test -bench RedisTake,
// store/).
func (r *Redis) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	nop := func() {}
	switch d, ok := ctx.Deadline(); {
	case r.late == nil || ok && time.Until(d) <= r.late.d:
		return ctx, nop
	case ctx.Done() == nil:
		return r.late.Context(ctx), nop
	}
	return context.WithTimeout(ctx, r.late.d)
}

// Validate returns an error for a nil client, an unusable option (ignored),
// or a client that does not end calls at the context's deadline; for a nil
// *Redis, an error.
func (r *Redis) Validate() error {
	if r == nil {
		return errors.New("store: a nil *Redis: make one with NewRedis")
	}
	if r.client == nil {
		return fmt.Errorf("store: %w", errNilClient)
	}
	if r.err != nil {
		return r.err
	}
	var ok, off bool // off: socket deadlines turned off (-2, kept as -1 by a Client, -2 by the others)
	switch c := r.client.(type) {
	case *redis.Client: // also what NewFailoverClient returns
		o := c.Options()
		ok, off = o.ContextTimeoutEnabled, o.ReadTimeout < 0 || o.WriteTimeout < 0
	case *redis.ClusterClient:
		o := c.Options()
		ok, off = o.ContextTimeoutEnabled, o.ReadTimeout < 0 || o.WriteTimeout < 0
	case *redis.Ring:
		o := c.Options()
		ok, off = o.ContextTimeoutEnabled, o.ReadTimeout < -1 || o.WriteTimeout < -1
	default:
		return fmt.Errorf("store: NewRedis was given a %T, whose deadlines it cannot check: use a go-redis Client, ClusterClient or Ring", r.client)
	}
	if !ok {
		return errors.New("store: the Redis client does not end calls at the context's deadline: set ContextTimeoutEnabled: true in its options (redis.Options, ClusterOptions, RingOptions, FailoverOptions or UniversalOptions)")
	}
	if off {
		return errors.New("store: the Redis client's ReadTimeout or WriteTimeout of -2 turns its socket deadlines off, so no call ends at the context's deadline: use -1 (the context's deadline alone) or a positive timeout")
	}
	return nil
}

// Key returns the Redis key of the bucket named key: the prefix and key, or "#"
// and its SHA-256 if key is longer than 128 bytes or starts with '#'. On a
// Cluster or Ring a hash tag of key's group (its first "{...}", else all of
// it) comes first: a group's keys share a slot. A window quota's state is
// under "#<kind>:" and the same.
func (r *Redis) Key(key string) string { return r.key(key, "") }

func (r *Redis) key(key, spec string) string {
	stored := key
	if h, ok := hashed(key); ok {
		stored = string(h[:])
	}
	if spec != "" {
		stored = "#" + spec + ":" + stored
	}
	if !r.tagged {
		return r.prefix + stored
	}
	t := tag(key)
	return r.prefix + "{" + string(t[:]) + "}" + stored
}

// Check runs the script once on a fresh key and returns what keeps the store
// from deciding (such as an ACL, naming what to grant), or nil.
func (r *Redis) Check(ctx context.Context) error {
	key := "#check:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err := r.Take(ctx, key, Limit{Rate: 1, Period: time.Millisecond, Burst: 1}, 1)
	if msg := strings.ToLower(fmt.Sprint(err)); strings.Contains(msg, "noperm") || strings.Contains(msg, "can't run this command") {
		return fmt.Errorf("store: check: the Redis user may not run the script: grant +evalsha +eval +time +get +set +del (ACL SETUSER): %w", err)
	} else if err != nil {
		return fmt.Errorf("store: check: %w", err)
	}
	return nil
}

// Take implements [Store]; a Redis error, or ctx ending first, is returned wrapped.
func (r *Redis) Take(ctx context.Context, key string, limit Limit, cost int) (Result, error) {
	return r.one(ctx, Request{Key: key, Limit: limit, Cost: cost}, 1, false)
}

// Reset implements [Admin], in one DEL (the keys share key's hash tag).
func (r *Redis) Reset(ctx context.Context, key string, quotas ...Limit) error {
	keys := []string{r.Key(key)}
	for _, l := range quotas {
		p, err := r.limits.get(l)
		if err != nil {
			return err
		}
		if p.spec != "" {
			keys = append(keys, r.key(key, p.spec))
		}
	}
	err := errNilClient
	if r.client != nil {
		err = r.client.Del(ctx, keys...).Err()
	}
	if err != nil {
		return fmt.Errorf("store: reset %q: %w", key, err)
	}
	return nil
}

// Block implements [Admin], in one script call like a Take's.
func (r *Redis) Block(ctx context.Context, key string, limit Limit, d time.Duration) error {
	res, err := r.one(ctx, Request{Key: key, Limit: limit, MaxDelay: d}, 1, true)
	if err == nil && !res.Allowed {
		err = errBlockFull(key)
	}
	return err
}

// TakeDelayed implements [Delayer].
func (r *Redis) TakeDelayed(ctx context.Context, key string, limit Limit, cost int, maxDelay time.Duration) (Result, error) {
	return r.one(ctx, Request{Key: key, Limit: limit, Cost: cost, MaxDelay: maxDelay}, 1, false)
}

// Refund implements [Refunder] with the same script and a negative cost.
func (r *Redis) Refund(ctx context.Context, key string, limit Limit, tokens int) (Result, error) {
	return r.one(ctx, Request{Key: key, Limit: limit, Cost: tokens}, -1, false)
}

// one decides q alone: a Take (sign 1), a Refund (-1), or a Block for MaxDelay.
func (r *Redis) one(ctx context.Context, q Request, sign int64, block bool) (Result, error) {
	p, k, err := r.limits.units(q.Key, q.Limit, q.Cost, sign < 0)
	var ps [1]params
	if err == nil {
		ps[0], err = p.extend(q.MaxDelay, block)
	}
	var debts [4]int64
	allowed := false
	if err == nil {
		allowed, err = r.group(ctx, []Request{q}, ps[:], []int{0}, sign, debts[:])
	}
	if err != nil {
		return Result{}, err
	}
	var res Result
	ps[0].fillFrom(&res, debts[:], k, 0, allowed)
	return res, nil
}

// windows returns the bounds of p's script call: those it sent, or those
// around the instant now of the reply, for windows from the epoch.
func (p *params) windows(now int64) [4]int64 {
	if p.b == [4]int64{} {
		return p.bounds(now)
	}
	return p.b
}

// replies is how many integers the script replies for p: a debt or a window.
func (p *params) replies() int {
	if p.spec != "" {
		return 4
	}
	return 2
}

// fillFrom puts in res the Result of a reply (a debt, or a window's view)
// after a decision of k, less the undo given back since.
func (p *params) fillFrom(res *Result, debts []int64, k, undo int64, allowed bool) {
	if p.spec == "" {
		du, df := p.after(debts[0], debts[1], -undo)
		p.fill(res, du, df, k, allowed)
		return
	}
	v := pick(p.windows(debts[0]), debts[0])
	v.prev, v.cur, v.far = debts[1], max(debts[2]-undo, 0), debts[3] > v.s
	p.fillWindow(res, v, k, allowed)
}

// TakeAll implements [MultiStore] in one atomic script call on a single node.
// On a Cluster or Ring each group of keys ([Redis.Key]) is a call, in order;
// if one is denied or fails, earlier ones' tokens go back (a failed refund
// leaves them taken) and later groups are read while ctx lasts.
func (r *Redis) TakeAll(ctx context.Context, reqs []Request) ([]Result, error) {
	ps, err := checkRequests(reqs, &r.limits)
	if err != nil {
		return nil, err
	}
	out, debts := make([]Result, len(reqs)), make([]int64, 4*len(reqs))
	fill := func(g []int, undo int64, allowed bool) { // undo 1: less what was given back
		for _, i := range g {
			k := int64(reqs[i].Cost) * ps[i].t
			ps[i].fillFrom(&out[i], debts[4*i:], k, undo*k, allowed)
		}
	}
	var tags [][8]byte // groups: reqs' indexes by hash tag, in order of appearance
	var groups [][]int
	for i, q := range reqs {
		var t [8]byte
		if r.tagged {
			t = tag(q.Key)
		}
		if j := slices.Index(tags, t); j >= 0 {
			groups[j] = append(groups[j], i)
		} else {
			tags, groups = append(tags, t), append(groups, []int{i})
		}
	}
	for gi, g := range groups {
		allowed, err := r.group(ctx, reqs, ps, g, 1, debts)
		if err != nil || !allowed {
			r.giveBack(ctx, reqs, ps, debts, groups[:gi])
		}
		if err != nil {
			return nil, err
		}
		fill(g, 0, allowed)
		if allowed {
			continue
		}
		for _, g := range groups[:gi] {
			fill(g, 1, false)
		}
		for _, g := range groups[gi+1:] { // read while ctx lasts
			if ctx.Err() == nil {
				if _, err := r.group(ctx, reqs, ps, g, 0, debts); err == nil {
					fill(g, 0, false)
				}
			}
		}
		for i := range out {
			out[i].Limit, out[i].Allowed = reqs[i].Limit, false
		}
		return out, nil
	}
	return out, nil
}

// group runs one script call for reqs at indexes g, costs times sign (1: take,
// 0: read, -1: give back), each reply into debts[4i:4i+4].
func (r *Redis) group(ctx context.Context, reqs []Request, ps []params, g []int, sign int64, debts []int64) (bool, error) {
	if r.client == nil {
		return false, fmt.Errorf("store: take %q: %w", reqs[g[0]].Key, errNilClient)
	}
	replies := 0
	for _, i := range g {
		replies += ps[i].replies()
	}
	c := newCall(ctx, reqs[g[0]].Key, len(g), replies)
	if r.tagged { // a group's keys share it
		c.tag = tag(reqs[g[0]].Key)
	}
	for _, i := range g {
		c.args = append(c.args, r.key(reqs[i].Key, ps[i].spec))
	}
	c.args = append(c.args, len(g)) // one group: all or nothing
	for _, i := range g {
		var k any = ps[i].k1 // boxed once: boxing an integer above 255 allocates
		if ps[i].block > 0 {
			k = ps[i].block
		} else if sign != 1 || reqs[i].Cost != 1 {
			k = sign * int64(reqs[i].Cost) * ps[i].t
		}
		switch b := ps[i].b; {
		case ps[i].spec == "":
			c.args = append(c.args, k, ps[i].args[0], ps[i].args[1])
		case b == [4]int64{} && ps[i].loc == nil && sign > 0: // found on Redis's clock; a refund's, the caller's
			c.args = append(c.args, k, ps[i].args[0], ps[i].epoch[0], ps[i].epoch[1])
		default:
			if b == [4]int64{} { // unless pinned to a take's window (giveBack)
				b = ps[i].bounds(r.clock().UnixMicro())
				ps[i].b = b
			}
			c.args = append(c.args, k, ps[i].args[0], ps[i].args[1], b[0], b[1], b[2], b[3])
		}
	}
	abandoned, err := r.exec(ctx, c)
	if abandoned { // a worker still holds c
		return false, err
	}
	j := 0
	for _, i := range g {
		j += copy(debts[4*i:4*i+ps[i].replies()], c.debts[j:])
	}
	allowed := c.allowed && err == nil
	c.release()
	return allowed, err
}

// giveBack refunds what the groups taken took (debts: their replies), each
// call within 100 ms even after ctx ends, waiting while ctx lasts. A window
// quota's count goes back only in its take's window.
func (r *Redis) giveBack(ctx context.Context, reqs []Request, ps []params, debts []int64, taken [][]int) {
	if len(taken) == 0 {
		return
	}
	reqs, ps = slices.Clone(reqs), slices.Clone(ps) // the caller may reuse reqs once TakeAll returns
	for _, g := range taken {
		for _, i := range g {
			if ps[i].spec != "" { // the take's window, the middle one
				v := pick(ps[i].windows(debts[4*i]), debts[4*i])
				ps[i].b = [4]int64{v.s - 1, v.s, v.e, v.e + 1}
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		scratch := make([]int64, 4*len(reqs))
		for _, g := range taken {
			gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 100*time.Millisecond)
			_, err := r.group(gctx, reqs, ps, g, -1, scratch)
			cancel()
			if err != nil {
				return // the rest stay taken: strict, never loose
			}
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// exec runs c through its node's batcher, or alone; abandoned as for do.
func (r *Redis) exec(ctx context.Context, c *call) (abandoned bool, err error) {
	if r.pipelines == 0 {
		return false, r.run(ctx, c)
	}
	b := r.single
	if r.cluster != nil {
		node, err := r.cluster.MasterForKey(ctx, c.args[3].(string))
		if err != nil { // no slot map yet, or no master for the slot
			return false, r.run(ctx, c)
		}
		v, ok := r.nodes.Load(node)
		if !ok {
			v, _ = r.nodes.LoadOrStore(node, &batcher{r: r, client: node})
		}
		b = v.(*batcher)
	}
	return b.do(ctx, c)
}

// run sends c alone and reads its reply; a client hook's panic is an error.
func (r *Redis) run(ctx context.Context, c *call) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("store: take %q: panic: %v", c.key, v)
		}
	}()
	ctx, cancel := r.bound(ctx)
	defer cancel()
	return r.read(ctx, c, r.do(ctx, c.args))
}

// do sends a script call's args through the client: EVALSHA, then EVAL on NOSCRIPT.
func (r *Redis) do(ctx context.Context, args []any) *redis.Cmd {
	cmd := r.client.Do(ctx, args...)
	if err := cmd.Err(); err != nil && isNoScript(err) {
		args = slices.Clone(args)
		args[0], args[1] = eval, srcArg
		cmd = r.client.Do(ctx, args...)
	}
	return cmd
}

// read reads c's reply from cmd.
func (r *Redis) read(ctx context.Context, c *call, cmd *redis.Cmd) error {
	reply, err := cmd.Result()
	if err != nil {
		var rerr redis.Error
		if r.cluster != nil && !errors.As(err, &rerr) {
			// A dead master answers no MOVED; go-redis would use it until its
			// slot map is 10s old, so reload that now (asynchronous, coalesced).
			r.cluster.ReloadState(ctx)
		}
		return fmt.Errorf("store: take %q: %w", c.key, err)
	}
	if v, ok := reply.([]any); !ok || !c.parse(v) {
		return fmt.Errorf("store: take %q: unexpected script reply %v", c.key, reply)
	}
	return nil
}

// parse reads c's part of a script reply: allowed (1 or 0), then c's debts.
func (c *call) parse(v []any) bool {
	ok := len(v) == 1+len(c.debts) && (v[0] == int64(1) || v[0] == int64(0))
	for i := 0; ok && i < len(c.debts); i++ {
		c.debts[i], ok = v[1+i].(int64)
		ok = ok && c.debts[i] >= 0
	}
	c.allowed = ok && v[0] == int64(1)
	return ok
}

// isNoScript reports whether err says Redis lacks the script, as proxies and
// managed services may reword it.
func isNoScript(err error) bool {
	var rerr redis.Error // a Redis reply: EVAL would not help a network error
	msg := strings.ToLower(err.Error())
	return errors.As(err, &rerr) && (strings.Contains(msg, "noscript") || strings.Contains(msg, "no matching script"))
}

// The script's name and source as arguments, boxed once.
var evalsha, shaArg, eval, srcArg = any("evalsha"), any(lua.TokenBucketSHA1), any("eval"), any(lua.TokenBucket)

// A call is one script call: a Take, or one group of a TakeAll.
type call struct {
	ctx      context.Context
	key      string  // the caller's first key, for errors
	tag      [8]byte // on a Cluster or Ring: a batch merges a tag's calls
	args     []any   // evalsha, sha, n, n keys, n, 3 (a window's 4 or 7) arguments per key
	allowed  bool
	debts    []int64 // the reply: du, df per key (a window's: 4)
	err      error
	done     chan struct{} // a worker has answered
	argsBuf  [12]any       // the backing arrays of a Take's call
	debtsBuf [4]int64
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// newCall returns a call for n keys, the first named key, and replies
// integers, its args up to its keys.
func newCall(ctx context.Context, key string, n, replies int) *call {
	c := callPool.Get().(*call)
	c.ctx, c.key, c.args, c.debts = ctx, key, c.argsBuf[:0], c.debtsBuf[:0]
	if n > 1 {
		c.args, c.debts = make([]any, 0, 4+8*n), make([]int64, 0, replies)
	}
	c.args, c.debts = append(c.args, evalsha, shaArg, n), c.debts[:replies]
	return c
}

// release returns c to the pool; only its caller does, once no worker holds it.
func (c *call) release() { *c = call{done: c.done}; callPool.Put(c) }

func (c *call) answer(err error) { c.err = err; c.done <- struct{}{} }
