package store

import (
	"context"
	"errors"
	"fmt"
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

// A batcher coalesces the Takes for one Redis node into pipelines. A Take
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

// work sends pipelines until the queue is empty.
func (b *batcher) work() {
	var batch []*call
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.active--
			b.mu.Unlock()
			return
		}
		n := min(len(b.queue), maxBatch)
		batch = append(batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.mu.Unlock()
		b.send(batch)
		clear(batch)
	}
}

// send runs one pipeline for batch and answers every call in it.
func (b *batcher) send(batch []*call) {
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			// Its caller has gone: do not spend a token it will not use.
			c.answer(fmt.Errorf("store: take %q: %w", c.key, err))
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	errs := b.run(live)
	for i, c := range live {
		c.answer(errs[i])
	}
}

// run sends calls in one pipeline (and those that met NOSCRIPT in a
// second, as EVAL), fills in their results and returns their errors.
func (b *batcher) run(calls []*call) (errs []error) {
	errs = make([]error, len(calls))
	defer func() {
		// A panic here (a client's hook, say) would end the process: no
		// handler can recover it on this goroutine. Every call gets it as
		// its error.
		if v := recover(); v != nil {
			for i, c := range calls {
				errs[i] = fmt.Errorf("store: take %q: panic: %v", c.key, v)
			}
		}
	}()
	ctx, cancel := batchContext(calls)
	defer cancel()
	cmds := b.pipeline(ctx, calls, func(p redis.Pipeliner, c *call) *redis.Cmd {
		return p.EvalSha(ctx, lua.TokenBucketSHA1, c.keys, c.args...)
	})
	var again []int
	for i, c := range calls {
		if err := cmds[i].Err(); err != nil && isNoScript(err) {
			again = append(again, i)
			continue
		}
		errs[i] = b.result(ctx, c, cmds[i])
	}
	if len(again) > 0 {
		retry := make([]*call, len(again))
		for j, i := range again {
			retry[j] = calls[i]
		}
		cmds = b.pipeline(ctx, retry, func(p redis.Pipeliner, c *call) *redis.Cmd {
			return p.Eval(ctx, lua.TokenBucket, c.keys, c.args...)
		})
		for j, i := range again {
			errs[i] = b.result(ctx, calls[i], cmds[j])
		}
	}
	return errs
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
