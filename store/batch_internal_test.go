package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
)

// retryHook delays the pipelines of exactly delayed commands, and calls
// afterFirst once the first pipeline has been answered.
type retryHook struct {
	delayed    int
	delay      time.Duration
	afterFirst func()
	once       sync.Once
}

func (h *retryHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *retryHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *retryHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == h.delayed {
			time.Sleep(h.delay)
		}
		err := next(ctx, cmds)
		h.once.Do(h.afterFirst)
		return err
	}
}

// TestBatcherRetryPipeline drives one pipeline in which five Takes of a
// bucket with 3 tokens left are coalesced next to two Takes of other
// buckets. The group is denied with room for 3, so its first 3 Takes are
// sent again alone; the first of them has a caller that gives up before
// that. The other buckets' Takes and the 2 denied ones must be answered
// without waiting for the second pipeline, and the caller that gave up must
// not be sent again: its token stays in the bucket.
func TestBatcherRetryPipeline(t *testing.T) {
	client := redistest.Server(t).Client(t)
	r := NewRedis(client, WithKeyPrefix(t.Name()+":"), WithBatching(1), WithCoalescing(true))
	ctx := context.Background()
	limit := Limit{Rate: 1, Period: time.Hour, Burst: 100}
	if res, err := r.Take(ctx, "P", limit, limit.Burst-3); err != nil || !res.Allowed {
		t.Fatalf("draining: %+v, %v", res, err)
	}
	b, err := r.boxedArgs(limit)
	if err != nil {
		t.Fatal(err)
	}
	gone, leave := context.WithCancel(ctx)
	defer leave()
	calls := []*call{r.takeCall(gone, "P", b, 1)}
	for range 4 {
		calls = append(calls, r.takeCall(ctx, "P", b, 1))
	}
	calls = append(calls, r.takeCall(ctx, "U1", b, 1), r.takeCall(ctx, "U2", b, 1))
	// The first pipeline holds 3 script calls (P's group, U1, U2); the
	// second, 2 (P's first 3 Takes but the one whose caller has gone).
	const delay = 2 * time.Second
	client.AddHook(&retryHook{delayed: 2, delay: delay, afterFirst: leave})

	start := time.Now()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		r.single1.run(calls, &scratch{})
	}()
	wait := func(i int) {
		t.Helper()
		select {
		case <-calls[i].done:
		case <-time.After(3 * delay):
			t.Fatalf("call %d was never answered", i)
		}
	}
	for _, i := range []int{5, 6, 3, 4, 0} {
		wait(i)
	}
	if took := time.Since(start); took >= delay {
		t.Errorf("the other buckets' Takes, the denied ones and the gone caller's were answered after %v, behind the second pipeline (%v)", took, delay)
	}
	for _, i := range []int{5, 6} {
		if c := calls[i]; c.err != nil || !c.res[0].Allowed || c.res[0].Remaining != limit.Burst-1 {
			t.Errorf("Take %d (%s): %+v, %v; want allowed", i, c.key, c.res[0], c.err)
		}
	}
	for _, i := range []int{3, 4} {
		if c := calls[i]; c.err != nil || c.res[0].Allowed || c.res[0].Remaining != 0 || c.res[0].RetryAfter <= 0 {
			t.Errorf("Take %d of P: %+v, %v; want denied", i, c.res[0], c.err)
		}
	}
	if err := calls[0].err; !errors.Is(err, context.Canceled) {
		t.Errorf("the Take whose caller gave up: %v; want its context's error", err)
	}
	wait(1)
	wait(2)
	<-finished
	for i, want := range map[int]int{1: 2, 2: 1} {
		if c := calls[i]; c.err != nil || !c.res[0].Allowed || c.res[0].Remaining != want {
			t.Errorf("Take %d of P, sent again: %+v, %v; want allowed with %d remaining", i, c.res[0], c.err, want)
		}
	}
	if res, err := r.Take(ctx, "P", limit, 0); err != nil || res.Remaining != 1 {
		t.Errorf("P after the run: %+v, %v; want 1 token left (the gone caller's)", res, err)
	}
}
