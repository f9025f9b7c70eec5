package store

import (
	"bytes"
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

// A batcher sends one Redis node's (or a Ring's) calls in pipelines, by a
// worker that exits once none are queued; a hash tag's calls share a script
// call. At 64 goroutines on one node, 2.0-2.9 times the decisions/s of a call
// per Take (3 passes of go test -bench Decide/redis/tollgate in bench/).
type batcher struct {
	r      *Redis
	client redis.UniversalClient
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

// release frees a pipeline slot, or hands it to a worker for calls queued.
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
			// Let the callers just answered queue their next Takes here, not go
			// alone through the slot this worker would free: +23 % on a hot
			// key, +7 % over 100,000 at 64 goroutines (bench/).
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

// send runs batch in one pipeline and answers every call, batch[:n] first; a
// client hook's panic or Goexit answers the rest with an error.
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
	ctx, cancelBound := b.r.bound(ctx)
	defer cancelBound()
	defer cancel()
	// One script call per hash tag (one in all on a single node): Redis spends
	// half the CPU per decision at 64 goroutines (make bench-peers, capacity).
	live := batch[n:]
	if b.r.tagged {
		slices.SortStableFunc(live, func(x, y *call) int { return bytes.Compare(x.tag[:], y.tag[:]) })
	}
	p := b.client.Pipeline()
	var units [][]*call
	var cmds []*redis.Cmd
	for len(live) > 0 {
		m := 1
		for m < len(live) && (!b.r.tagged || live[m].tag == live[0].tag) {
			m++
		}
		units, live = append(units, live[:m]), live[m:]
		cmds = append(cmds, p.Do(ctx, merge(units[len(units)-1])...))
	}
	_, perr := p.Exec(ctx)
	for i, u := range units {
		cmd := cmds[i]
		err := cmd.Err()
		if err == nil && cmd.Val() == nil && perr != nil {
			cmd.SetErr(perr) // never answered: the connection failed first
			err = perr
		}
		// Sent again: as EVAL, or via the Cluster client (redirects).
		again := err != nil && (isNoScript(err) || (b.r.cluster != nil && isRedirect(err)))
		if again && len(u) > 1 {
			cmd, again = b.r.do(ctx, merge(u)), false
			err = cmd.Err()
		}
		v, _ := cmd.Val().([]any)
		if replies := 0; err == nil && len(u) > 1 {
			for _, c := range u {
				replies += 1 + len(c.debts)
			}
			if len(v) != replies {
				err = fmt.Errorf("unexpected script reply %v", cmd.Val())
			}
		}
		for _, c := range u { // c is its caller's once answered
			m, cerr := 1+len(c.debts), error(nil)
			switch {
			case again:
				cerr = b.r.run(c.ctx, c)
			case len(u) > 1 && isRefused(err): // one call's arguments: each alone, for its own answer
				cerr = b.r.run(c.ctx, c)
			case len(u) == 1 || cmd.Err() != nil:
				cerr = b.r.read(ctx, c, cmd)
			case err != nil:
				cerr = fmt.Errorf("store: take %q: %w", c.key, err)
			case v[0] == int64(-1): // a key Redis could not read: alone, for its error
				cerr = b.r.run(c.ctx, c)
			case !c.parse(v[:m]):
				cerr = fmt.Errorf("store: take %q: unexpected script reply %v", c.key, cmd.Val())
			}
			if err == nil && len(u) > 1 {
				v = v[m:]
			}
			n++
			c.answer(cerr)
		}
	}
}

// merge returns the arguments of one script call for calls, a group each:
// all their keys, then all their groups.
func merge(calls []*call) []any {
	if len(calls) == 1 {
		return calls[0].args
	}
	args := []any{evalsha, shaArg, 0}
	for _, c := range calls {
		args[2] = args[2].(int) + c.args[2].(int)
		args = append(args, c.args[3:3+c.args[2].(int)]...)
	}
	for _, c := range calls {
		args = append(args, c.args[3+c.args[2].(int):]...)
	}
	return args
}

// batchContext returns a pipeline's context: its first call's values (for
// client hooks), and the calls' latest deadline if all have one.
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

// isRefused reports whether err is the script's refusal of its arguments (a
// Redis reply, as go-redis returns it: no other error reads so).
func isRefused(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "ERR tollgate:") }

// isRedirect reports whether err says a Cluster node cannot serve the key now.
func isRedirect(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && slices.ContainsFunc([]string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "LOADING ", "READONLY "},
		func(p string) bool { return strings.HasPrefix(err.Error(), p) })
}
