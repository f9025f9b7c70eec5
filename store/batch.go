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
)

// maxBatch bounds the script calls in one pipeline, so that one write stays
// small and one slow reply holds up few callers.
const maxBatch = 128

// A batcher gathers the calls for one Redis node (or a Ring) into
// pipelines. A call goes out at once, alone, from its caller's goroutine
// when nothing is queued and fewer than r.pipelines pipelines are in flight:
// at low load batching adds nothing. Otherwise it is queued, and a worker
// sends everything queued in one pipeline. Workers exit when the queue is
// empty, so an idle store runs no goroutine.
//
// Batching is kept for what it was measured to give: at 64 goroutines on
// one node, 1.7-2.6 times the decisions per second of a call per Take
// (make bench-peers, tollgate-batch0 rows), since Redis reads and writes
// one socket buffer for many calls.
type batcher struct {
	r      *Redis
	client redis.UniversalClient // the node's client (or the Ring)

	mu     sync.Mutex
	queue  []*call
	active int // pipelines in flight, direct calls included
}

// do runs c and waits until it is answered or ctx ends; abandoned is true
// when ctx ended first, and a worker still holds c.
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

// release frees a pipeline slot, or hands it to a worker for the calls
// queued meanwhile.
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
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.active--
			b.mu.Unlock()
			returned = true
			return
		}
		n := min(len(b.queue), maxBatch)
		batch := slices.Clone(b.queue[:n])
		b.queue = append(b.queue[:0], b.queue[n:]...)
		clear(b.queue[len(b.queue):cap(b.queue)])
		b.mu.Unlock()
		b.send(batch)
	}
}

// send runs batch in one pipeline and answers every call in it. When a
// client hook panics or ends the goroutine (runtime.Goexit), the calls not
// yet answered get an error, so that no caller waits for ever, and a panic
// does not end the process.
func (b *batcher) send(batch []*call) {
	answered := make([]bool, len(batch))
	answer := func(i int, err error) {
		answered[i] = true
		batch[i].answer(err) // its caller may reuse batch[i] from now on
	}
	defer func() {
		v := recover()
		for i, c := range batch {
			switch {
			case answered[i]:
			case v != nil:
				answer(i, fmt.Errorf("store: take %q: panic: %v", c.key, v))
			default:
				answer(i, fmt.Errorf("store: take %q: a Redis client hook ended the sending goroutine (runtime.Goexit)", c.key))
			}
		}
	}()
	var live []int
	for i, c := range batch {
		if err := c.ctx.Err(); err != nil {
			answer(i, fmt.Errorf("store: take %q: %w", c.key, err)) // its caller has gone: spend no token
			continue
		}
		live = append(live, i)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(batch, live)
	defer cancel()
	p := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(live))
	for j, i := range live {
		cmds[j] = p.Do(ctx, batch[i].args...)
	}
	_, perr := p.Exec(ctx)
	for j, i := range live {
		c, cmd := batch[i], cmds[j]
		err := cmd.Err()
		if err == nil && cmd.Val() == nil && perr != nil {
			cmd.SetErr(perr) // never answered: the connection failed first
			err = perr
		}
		if err != nil && (isNoScript(err) || (b.r.cluster != nil && isRedirect(err))) {
			// Sent again alone: as EVAL, or through the Cluster client,
			// which follows the redirection.
			answer(i, b.r.run(c.ctx, c))
			continue
		}
		answer(i, b.r.read(ctx, c, cmd))
	}
}

// batchContext returns the context a pipeline runs under: the values of its
// first call (for client hooks such as tracing), no cancellation (one
// caller leaving must not fail the others), and the latest deadline of the
// calls, or none if one has none.
func batchContext(batch []*call, live []int) (context.Context, context.CancelFunc) {
	first := context.WithoutCancel(batch[live[0]].ctx)
	var last time.Time
	for _, i := range live {
		d, ok := batch[i].ctx.Deadline()
		if !ok {
			return first, func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(first, last)
}

// isRedirect reports whether a Cluster node's error means that the key is
// now served elsewhere, or that the node cannot serve it at the moment.
func isRedirect(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, p := range [...]string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "LOADING ", "READONLY "} {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	return false
}
