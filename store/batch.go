package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBatch bounds a batch: small writes, few callers held up by a slow reply.
const maxBatch = 128

// A batcher sends one Redis node's (or a Ring's) calls in batches, by a worker
// that exits once none are queued: on a single node one script call, else a
// pipeline. At 64 goroutines on one node, 2.0-2.9 times the decisions/s of a
// call per Take (3 passes of go test -bench Decide/redis/tollgate in bench/).
type batcher struct {
	r      *Redis
	client redis.UniversalClient // the node's client (or the Ring)
	mu     sync.Mutex
	queue  []*call
	active int // pipelines in flight, direct calls included
}

// do runs c and waits for its answer; abandoned: ctx ended while a worker has c.
func (b *batcher) do(ctx context.Context, c *call) (abandoned bool, err error) {
	b.mu.Lock()
	if len(b.queue) == 0 && b.active < b.r.pipelines {
		b.active++
		b.mu.Unlock()
		defer b.release()
		return false, b.r.run(ctx, c)
	}
	b.queue = append(b.queue, c)
	start := b.active < b.r.pipelines
	if start {
		b.active++
	}
	b.mu.Unlock()
	if start {
		go b.work()
	}
	select {
	case <-c.done:
		return false, c.err
	case <-ctx.Done():
		select {
		case <-c.done: // answered as ctx ended: the answer counts
			return false, c.err
		default:
		}
		return true, fmt.Errorf("store: take %q: %w", c.key, ctx.Err())
	}
}

// release frees a pipeline slot, or hands it to a worker for calls queued since.
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
	returned := false
	defer func() {
		if !returned { // a client hook ended the goroutine: hand the slot on
			b.release()
		}
	}()
	for yielded := false; ; {
		b.mu.Lock()
		if len(b.queue) == 0 && !yielded {
			// Let the callers just answered queue their next Takes here, not
			// each go alone through the slot this worker would free: +23 %
			// on a hot key, +7 % over 100,000 at 64 goroutines (bench/).
			b.mu.Unlock()
			runtime.Gosched()
			yielded = true
			continue
		}
		if len(b.queue) == 0 {
			b.active--
			b.mu.Unlock()
			returned = true
			return
		}
		yielded = false
		n := min(len(b.queue), maxBatch)
		batch := slices.Clone(b.queue[:n])
		b.queue = append(b.queue[:0], b.queue[n:]...)
		clear(b.queue[len(b.queue):cap(b.queue)])
		b.mu.Unlock()
		b.send(batch)
	}
}

// send runs batch in one pipeline and answers every call, in order (batch[:n]
// are answered). On a client hook's panic or Goexit, the rest get an error.
func (b *batcher) send(batch []*call) {
	n := 0
	defer func() {
		v := recover()
		for _, c := range batch[n:] {
			if v != nil {
				c.answer(fmt.Errorf("store: take %q: panic: %v", c.key, v))
			} else {
				c.answer(fmt.Errorf("store: take %q: a Redis client hook ended the sending goroutine (runtime.Goexit)", c.key))
			}
		}
	}()
	for i, c := range batch { // a call whose caller has gone spends no token
		if err := c.ctx.Err(); err != nil {
			batch[n], batch[i] = c, batch[n]
			n++
			c.answer(fmt.Errorf("store: take %q: %w", c.key, err))
		}
	}
	if n == len(batch) {
		return
	}
	ctx, cancel := batchContext(batch[n:])
	defer cancel()
	if !b.r.tagged && len(batch)-n > 1 {
		b.merged(ctx, batch, &n)
		return
	}
	p := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch[n:] {
		cmds[n+i] = p.Do(ctx, c.args...)
	}
	_, perr := p.Exec(ctx)
	for n < len(batch) {
		c, cmd := batch[n], cmds[n]
		err := cmd.Err()
		if err == nil && cmd.Val() == nil && perr != nil {
			cmd.SetErr(perr) // never answered: the connection failed first
			err = perr
		}
		if err != nil && (isNoScript(err) || (b.r.cluster != nil && isRedirect(err))) {
			// Sent again alone: as EVAL, or via the Cluster client (redirects).
			err = b.r.run(c.ctx, c)
		} else {
			err = b.r.read(ctx, c, cmd)
		}
		n++
		c.answer(err)
	}
}

// merged runs batch[*n:] as one script call, each call a group of its own
// (a single node takes any keys in one call), and answers them in order,
// counting in *n. One script call instead of one per Take: Redis spends about
// half the CPU per decision at 64 goroutines (make bench-peers, capacity).
func (b *batcher) merged(ctx context.Context, batch []*call, n *int) {
	calls, args, replies := batch[*n:], []any{evalsha, shaArg, 0}, 0
	for _, c := range calls {
		args[2] = args[2].(int) + c.args[2].(int)
		args = append(args, c.args[3:3+c.args[2].(int)]...)
		replies += 1 + len(c.debts)
	}
	for _, c := range calls {
		args = append(args, c.args[3+c.args[2].(int):]...)
	}
	reply, err := b.client.Do(ctx, args...).Result()
	v, ok := reply.([]any)
	if err == nil && (!ok || len(v) != replies) {
		err = fmt.Errorf("unexpected script reply %v", reply)
	}
	for _, c := range calls { // c is its caller's once answered
		*n++
		switch m := 1 + len(c.debts); {
		case err != nil && isNoScript(err):
			c.answer(b.r.run(c.ctx, c)) // alone, as EVAL
		case err != nil:
			c.answer(fmt.Errorf("store: take %q: %w", c.key, err))
		case !c.parse(v[:m]):
			v = v[m:]
			c.answer(fmt.Errorf("store: take %q: unexpected script reply %v", c.key, reply))
		default:
			v = v[m:]
			c.answer(nil)
		}
	}
}

// batchContext returns a pipeline's context: its first call's values (for
// client hooks), no cancellation, and the calls' latest deadline, if all have one.
func batchContext(calls []*call) (context.Context, context.CancelFunc) {
	first := context.WithoutCancel(calls[0].ctx)
	var last time.Time
	for _, c := range calls {
		if d, ok := c.ctx.Deadline(); !ok {
			return first, func() {}
		} else if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(first, last)
}

// isRedirect reports whether err says a Cluster node cannot serve the key now.
func isRedirect(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && slices.ContainsFunc([]string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "LOADING ", "READONLY "},
		func(p string) bool { return strings.HasPrefix(err.Error(), p) })
}
