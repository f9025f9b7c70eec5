package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/lua"
)

// DefaultBatchPipelines is the number of pipelines a [Redis] store keeps in
// flight per Redis node unless [WithBatching] says otherwise. Two keep
// Redis busy while the other is on its way back, and fewer, fuller
// pipelines cost Redis fewer reads and writes per Take: at 64 goroutines
// on one node, 2 decided 2–9 % more than 4 (medians of alternating runs),
// and 4 more than 16.
const DefaultBatchPipelines = 2

// maxBatch bounds the number of script calls in one pipeline, so that one
// write stays small and one slow reply holds up few callers.
const maxBatch = 128

// A batcher gathers the Takes for one Redis node into pipelines. A Take
// joins the queue; if fewer than max pipelines are in flight, a worker
// starts at once and sends everything queued, so at low load a call goes
// out immediately, alone — there is no linger. While max pipelines are in
// flight, calls queue and leave together in the next one. Workers exit
// when the queue is empty: an idle store runs no goroutine.
type batcher struct {
	r      *Redis
	client redis.UniversalClient // the node's client (or the Ring)
	max    int

	mu     sync.Mutex
	queue  []*call
	active int
}

// A call is one script call: a Take (one key) or a TakeAll group (several
// keys sharing a hash tag).
type call struct {
	ctx  context.Context
	key  string   // the caller's first key, for errors
	keys []string // the script's KEYS
	args []any    // the script's ARGV: the one-key form's 2 or 3, or 4 per key
	res  []Result // one per key, filled in by the call
	err  error

	// The one-key form of the script (oneKey): its reply is read in the
	// limit's units u, the decision adding k to the debt.
	oneKey bool
	u      units
	k      int64
	done   chan struct{} // signalled when res and err are set

	// In a pipeline (see coalesce): the call's index in it, and the calls
	// that decide with it in one script call, linked from the first (the
	// lead, whose n counts them and whose last is the last of them).
	idx        int
	n          int64
	next, last *call
	nargs      [3]any // the lead's arguments when n > 1

	// Backing arrays for a one-key call, so that a Take allocates none.
	keys1 [1]string
	args1 [4]any
	res1  [1]Result
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func newCall(ctx context.Context, key string) *call {
	c := callPool.Get().(*call)
	c.ctx, c.key = ctx, key
	return c
}

// setOneKey makes c a call of the script's one-key form for a limit in
// units u and a decision of cost tokens; the caller sets its arguments.
func (c *call) setOneKey(u units, cost int64) {
	c.oneKey, c.u, c.k = true, u, cost*u.t
}

// release returns c to the pool. Only the caller does, and only when no
// worker still holds c.
func (c *call) release() {
	*c = call{done: c.done}
	callPool.Put(c)
}

// do queues c and waits until it is answered or ctx ends; abandoned is true
// when ctx ended first (a worker still holds c). When nothing is queued and
// a pipeline slot is free, and direct is true (the client ends its I/O at
// ctx's deadline, or ctx has none), the caller sends its call itself: at low
// load a call costs no hand-over to another goroutine.
func (b *batcher) do(ctx context.Context, c *call, direct bool) (err error, abandoned bool) {
	b.mu.Lock()
	if direct && len(b.queue) == 0 && b.active < b.max {
		b.active++
		b.mu.Unlock()
		defer b.release()
		return b.r.run(ctx, c), false
	}
	b.queue = append(b.queue, c)
	start := b.active < b.max
	if start {
		b.active++
	}
	b.mu.Unlock()
	if start {
		go b.work()
	}
	return c.wait(ctx)
}

// wait waits until c is answered or ctx ends; abandoned is true when ctx
// ended first, and another goroutine still holds c.
func (c *call) wait(ctx context.Context) (err error, abandoned bool) {
	select {
	case <-c.done:
		return c.err, false
	case <-ctx.Done():
		select {
		case <-c.done: // answered as ctx ended: the answer counts
			return c.err, false
		default:
		}
		return fmt.Errorf("store: take %q: %w", c.key, ctx.Err()), true
	}
}

// release frees the pipeline slot of a direct call, or hands it to a worker
// for the calls that queued meanwhile.
func (b *batcher) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.active--
		return
	}
	go b.work()
}

// errGoexit answers the calls whose goroutine a client hook ended with
// runtime.Goexit before they were answered.
var errGoexit = errors.New("a client hook ended the goroutine sending the call (runtime.Goexit)")

// work sends pipelines until the queue is empty.
func (b *batcher) work() {
	var batch []*call
	var sc scratch
	exited := true // until the loop returns: a client hook ended the goroutine
	defer func() {
		if exited {
			// Hand the pipeline slot on, or the queue would wait for ever
			// once every slot was lost this way.
			b.release()
		}
	}()
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.active--
			b.mu.Unlock()
			exited = false
			return
		}
		n := min(len(b.queue), maxBatch)
		batch = append(batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.mu.Unlock()
		b.send(batch, &sc)
		clear(batch)
	}
}

// A scratch holds what a worker reuses from one pipeline to the next.
type scratch struct {
	open     map[bucketCost]*call // see coalesce
	leads    []*call
	errs     []error
	answered []bool
	later    []bool
}

// reset empties sc for a pipeline of n calls.
func (sc *scratch) reset(n int) {
	clear(sc.open)
	sc.leads = slices.Grow(sc.leads[:0], n)
	sc.errs = append(sc.errs[:0], make([]error, n)...)
	sc.answered = append(sc.answered[:0], make([]bool, n)...)
	sc.later = append(sc.later[:0], make([]bool, n)...)
}

// done drops sc's references to calls, which their callers reuse.
func (sc *scratch) done() {
	clear(sc.open)
	clear(sc.leads[:cap(sc.leads)])
	clear(sc.errs)
}

// send runs one pipeline for batch and answers every call in it.
func (b *batcher) send(batch []*call, sc *scratch) {
	live := batch[:0] // in place: the worker clears batch afterwards
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			// Its caller has gone: do not spend a token it will not use.
			c.answer(fmt.Errorf("store: take %q: %w", c.key, err))
			continue
		}
		live = append(live, c)
	}
	if len(live) > 0 {
		b.run(live, sc)
	}
}

// run sends calls in a pipeline, one script call each, or one per bucket
// when the store coalesces (see coalesce), and answers every call. When a
// bucket's Takes were denied while the first of them would have been
// allowed in turn, the other calls are answered first, and those Takes are
// sent again one by one, in a second pipeline (unless their callers have
// gone meanwhile).
func (b *batcher) run(calls []*call, sc *scratch) {
	sc.reset(len(calls))
	defer sc.done()
	errs, answered, later := sc.errs, sc.answered, sc.later
	finish := func(i int) {
		answered[i] = true
		calls[i].answer(errs[i]) // the caller may now reuse calls[i]
	}
	defer func() {
		// A panic here (a client's hook, say) would end the process: no
		// handler can recover it on this goroutine. Every call not yet
		// answered gets it as its error. A call is also left unanswered
		// when a hook ends the goroutine with runtime.Goexit (recover then
		// returns nil): its caller must not wait for ever either.
		v := recover()
		for i, c := range calls {
			if answered[i] {
				continue
			}
			if v != nil {
				errs[i] = fmt.Errorf("store: take %q: panic: %v", c.key, v)
			} else {
				errs[i] = fmt.Errorf("store: take %q: %w", c.key, errGoexit)
			}
			finish(i)
		}
	}()
	leads := coalesce(calls, sc, b.r.coalesce)
	ctx, cancel := batchContext(calls)
	defer cancel()
	cmds := b.script(ctx, leads)
	var alone []*call
	for i, c := range leads {
		alone = b.answer(ctx, c, cmds[i], errs, alone)
	}
	for _, c := range alone {
		later[c.idx] = true
		c.n, c.next, c.last = 1, nil, nil
	}
	for i := range calls {
		if !later[i] {
			finish(i)
		}
	}
	if len(alone) == 0 {
		return
	}
	live := alone[:0]
	for _, c := range alone {
		if err := c.ctx.Err(); err != nil {
			// Its caller has gone: do not spend a token it will not use.
			errs[c.idx] = fmt.Errorf("store: take %q: %w", c.key, err)
			finish(c.idx)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel = batchContext(live)
	defer cancel()
	cmds = b.script(ctx, live)
	for i, c := range live {
		b.answer(ctx, c, cmds[i], errs, nil)
		finish(c.idx)
	}
}

// script sends one script call per lead in a pipeline, and those that met
// NOSCRIPT again in a second, as EVAL. It returns their commands.
func (b *batcher) script(ctx context.Context, leads []*call) []*redis.Cmd {
	cmds := b.pipeline(ctx, leads, func(p redis.Pipeliner, c *call) *redis.Cmd {
		return p.EvalSha(ctx, lua.TokenBucketSHA1, c.keys, c.groupArgs()...)
	})
	var again []int
	for i := range leads {
		if err := cmds[i].Err(); err != nil && isNoScript(err) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		retry := make([]*call, len(again))
		for j, i := range again {
			retry[j] = leads[i]
		}
		evals := b.pipeline(ctx, retry, func(p redis.Pipeliner, c *call) *redis.Cmd {
			return p.Eval(ctx, lua.TokenBucket, c.keys, c.groupArgs()...)
		})
		for j, i := range again {
			cmds[i] = evals[j]
		}
	}
	return cmds
}

// A bucketCost is what one-key Takes must share to be coalesced: the
// bucket (its Redis key), the limit (in units) and the cost.
type bucketCost struct {
	key string
	u   units
	k   int64
}

// coalesce groups the one-key Takes in calls that share a bucketCost into
// one script call each, of their summed cost: n Takes of k units at one
// instant are allowed together exactly when each would be allowed in turn,
// and when none of them would be, each is denied with the same figures as
// alone. The call takes at most the bucket's capacity (the script rejects a
// cost above it): when the group holds more Takes than that, the rest
// would be denied in turn whatever the bucket holds (see parseGroup).
// Refunds, peeks (cost 0) and TakeAll groups of several keys are never
// coalesced, and nothing is when on is false (the store's default: every
// call is then its own lead). coalesce numbers the calls (idx) and returns
// the leads, in the order of calls.
// It uses sc's map and leads.
func coalesce(calls []*call, sc *scratch, on bool) []*call {
	leads := sc.leads[:0]
	for i, c := range calls {
		c.idx, c.n, c.next, c.last = i, 1, nil, nil
		if !on || !c.oneKey || c.k <= 0 || len(calls) == 1 {
			leads = append(leads, c)
			continue
		}
		bc := bucketCost{c.keys[0], c.u, c.k}
		if lead := sc.open[bc]; lead != nil {
			if lead.last == nil {
				lead.next = c
			} else {
				lead.last.next = c
			}
			lead.last = c
			lead.n++
			continue
		}
		if sc.open == nil {
			sc.open = make(map[bucketCost]*call)
		}
		sc.open[bc] = c
		leads = append(leads, c)
	}
	sc.leads = leads
	return leads
}

// groupArgs returns the script's arguments for c and the calls coalesced
// with it: those of a Take of their summed cost, or of as many of them as
// the bucket can hold.
func (c *call) groupArgs() []any {
	if c.n <= 1 {
		return c.args
	}
	n := copy(c.nargs[:], c.args)
	c.nargs[1] = c.sent() * c.k
	return c.nargs[:n]
}

// sent is the number of the Takes in c's group that its script call takes.
func (c *call) sent() int64 { return min(c.n, c.u.cap/c.k) }

// answer reads the reply to lead's script call into lead and the calls
// coalesced with it, and sets their errors in errs. The calls of a denied
// group that would have been allowed in turn are appended to alone, to be
// sent again one by one; answer returns alone.
func (b *batcher) answer(ctx context.Context, lead *call, cmd *redis.Cmd, errs []error, alone []*call) []*call {
	if lead.n <= 1 {
		errs[lead.idx] = b.result(ctx, lead, cmd)
		return alone
	}
	err := cmd.Err()
	if err != nil && b.r.cluster != nil && isRedirect(err) {
		for c := lead; c != nil; c = c.next {
			errs[c.idx] = b.r.run(c.ctx, c)
		}
		return alone
	}
	if err == nil {
		var retry int64
		if retry, err = lead.parseGroup(cmd.Val()); err == nil {
			for c := lead; retry > 0 && c != nil; c, retry = c.next, retry-1 {
				alone = append(alone, c)
			}
			return alone
		}
	} else {
		b.r.failed(ctx, err)
	}
	for c := lead; c != nil; c = c.next {
		errs[c.idx] = fmt.Errorf("store: take %q: %w", c.key, err)
	}
	return alone
}

// parseGroup reads the one-key form's reply to the script call of lead's
// group into the result of every call in it, in turn, as if each had been
// sent alone at the same instant. When the script call was allowed, its
// sent Takes are, and any after them are denied: the bucket then has no
// room for one more. When it was denied, the first retry Takes would have
// been allowed in turn: parseGroup leaves them to be sent again, and
// answers the others as denied after those.
func (lead *call) parseGroup(reply any) (retry int64, err error) {
	r, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("unexpected script reply %v", reply)
	}
	u, k, sent := lead.u, lead.k, lead.sent()
	debt, allowed := r-sent*k, sent // the debt before the group's Takes
	if r < 0 {
		if debt = -1 - r; debt < 0 || debt > u.cap {
			return 0, fmt.Errorf("unexpected script reply %v", reply)
		}
		retry = min((u.cap-debt)/k, lead.n) // fewer than sent: the call was denied
		debt, allowed = debt+retry*k, 0
	}
	i := int64(0)
	for c := lead; c != nil; c, i = c.next, i+1 {
		if i < retry {
			continue
		}
		reply := -1 - debt // denied: the debt stays
		if i < allowed {
			debt += k
			reply = debt
		}
		if c.res[0], ok = u.result(reply, k); !ok {
			return 0, fmt.Errorf("unexpected script reply %v to %d coalesced Takes", r, lead.n)
		}
	}
	return retry, nil
}

func (b *batcher) pipeline(ctx context.Context, calls []*call, add func(redis.Pipeliner, *call) *redis.Cmd) []*redis.Cmd {
	p := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = add(p, c)
	}
	if _, err := p.Exec(ctx); err != nil {
		// A command that was never answered (the connection failed before
		// its reply) carries no error of its own: give it the pipeline's.
		for _, cmd := range cmds {
			if cmd.Err() == nil && cmd.Val() == nil {
				cmd.SetErr(err)
			}
		}
	}
	return cmds
}

// result reads c's answer from its command. On a Cluster node, a reply that
// sends the key elsewhere (MOVED, ASK, a node going down) is retried alone
// through the Cluster client, which follows redirections.
func (b *batcher) result(ctx context.Context, c *call, cmd *redis.Cmd) error {
	err := cmd.Err()
	if err != nil && b.r.cluster != nil && isRedirect(err) {
		return b.r.run(c.ctx, c)
	}
	if err != nil {
		b.r.failed(ctx, err)
		return fmt.Errorf("store: take %q: %w", c.key, err)
	}
	if err := c.parse(cmd.Val()); err != nil {
		return fmt.Errorf("store: take %q: %w", c.key, err)
	}
	return nil
}

func (c *call) answer(err error) {
	c.err = err
	c.done <- struct{}{}
}

// batchContext returns the context a pipeline runs under: the values of the
// first call (for client hooks such as tracing), no cancellation (one
// caller leaving must not fail the others), and the latest deadline of the
// calls, or none if one has none.
func batchContext(calls []*call) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(calls[0].ctx), func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].ctx), last)
}

// isRedirect reports whether a Cluster node's error means that the key is
// now served elsewhere, or that the node cannot serve it at the moment.
func isRedirect(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := err.Error()
	for _, p := range [...]string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "LOADING ", "READONLY "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
