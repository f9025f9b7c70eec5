package store_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/lua"
	"github.com/tollgate-go/tollgate/store"
	"github.com/tollgate-go/tollgate/storetest"
)

// pipeCounter is a client hook that counts the writes of script calls (a
// single command or a pipeline), the calls in them, the keys they decide, and
// the most writes in flight at once.
type pipeCounter struct {
	sends, calls, keys    atomic.Int64
	inFlight, maxInFlight atomic.Int64
	mu                    sync.Mutex
	sizes                 map[int]int
}

func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

func (h *pipeCounter) count(cmds ...redis.Cmder) func() {
	n := len(cmds)
	atomicMax(&h.maxInFlight, h.inFlight.Add(1))
	h.sends.Add(1)
	h.calls.Add(int64(n))
	for _, cmd := range cmds {
		if k, ok := cmd.Args()[2].(int); ok {
			h.keys.Add(int64(k))
		}
	}
	h.mu.Lock()
	if h.sizes == nil {
		h.sizes = map[int]int{}
	}
	h.sizes[n]++
	h.mu.Unlock()
	return func() { h.inFlight.Add(-1) }
}

func (h *pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			defer h.count(cmd)()
		}
		return next(ctx, cmd)
	}
}
func (h *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if isScript(cmds[0]) { // not the connection's handshake
			defer h.count(cmds...)()
		}
		return next(ctx, cmds)
	}
}

// countScripts adds a pipeCounter to client: on a Cluster, to each master's
// own client, which batches go to.
func countScripts(client redis.UniversalClient) *pipeCounter {
	h := &pipeCounter{}
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(c *redis.Client) { c.AddHook(h) })
	} else {
		client.AddHook(h)
	}
	return h
}

// serverAndCluster are the clients the batching tests run on: a real
// redis-server, and a real 3-master Cluster.
var serverAndCluster = []struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}{
	{"server", func(t *testing.T) redis.UniversalClient { return redistest.Server(t).Client(t) }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.Cluster(t).Client(t) }},
}

func atomicMax(a *atomic.Int64, n int64) {
	for {
		m := a.Load()
		if n <= m || a.CompareAndSwap(m, n) {
			return
		}
	}
}

func TestConformanceRedisServerUnbatched(t *testing.T) {
	t.Parallel()
	client := redistest.Server(t).Client(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(client, store.WithBatching(0)) },
		Slack: 50 * time.Millisecond,
	})
}

// Serial Takes leave one by one, at once: batching adds no linger.
func TestBatchingSerialGoesAlone(t *testing.T) {
	leaktest.Check(t)
	client := redistest.Server(t).Client(t)
	if err := client.ScriptLoad(context.Background(), lua.TokenBucket).Err(); err != nil {
		t.Fatal(err) // so that no EVAL follows a NOSCRIPT below
	}
	h := &pipeCounter{}
	client.AddHook(h)
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"))
	ctx := context.Background()
	for i := range 50 {
		res, err := s.Take(ctx, "k", store.PerMinute(100), 1)
		if err != nil || !res.Allowed || res.Remaining != 99-i {
			t.Fatalf("Take %d = %+v, %v; want allowed, remaining %d", i, res, err, 99-i)
		}
	}
	if n, c := h.sends.Load(), h.calls.Load(); n != 50 || c != 50 {
		t.Errorf("50 serial Takes went out in %d writes of %d script calls; want 50 of 1", n, c)
	}
}

// Concurrent Takes are coalesced into fewer pipelines than Takes, never
// more than the configured number in flight, and every caller gets the
// answer for its own key and limit.
func TestBatchingCoalescesAndRoutes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		client    func(t *testing.T) redis.UniversalClient
		pipelines int
		nodes     int
	}{
		{"server", func(t *testing.T) redis.UniversalClient { return redistest.Server(t).Client(t) }, 2, 1},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.Cluster(t).Client(t) }, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaktest.Check(t)
			client := tc.client(t)
			h := countScripts(client)
			// So that no EVAL follows a NOSCRIPT below.
			if err := client.ScriptLoad(context.Background(), lua.TokenBucket).Err(); err != nil {
				t.Fatal(err)
			}
			s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(tc.pipelines))
			const goroutines, rounds = 64, 20
			ctx := context.Background()
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each goroutine has its own key and its own burst, so
					// a misrouted answer shows in Remaining.
					limit := store.Limit{Rate: 1, Period: time.Hour, Burst: 100 + g}
					for i := range rounds {
						res, err := s.Take(ctx, fmt.Sprintf("g%d", g), limit, 1)
						if want := 100 + g - 1 - i; err != nil || !res.Allowed || res.Remaining != want || res.Limit != limit {
							errs <- fmt.Errorf("goroutine %d, Take %d = %+v, %v; want allowed, remaining %d", g, i, res, err, want)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			takes, sends := int64(goroutines*rounds), h.sends.Load()
			t.Logf("%d Takes in %d writes (%.1f per write), at most %d in flight; calls per write: %v",
				takes, sends, float64(h.calls.Load())/float64(sends), h.maxInFlight.Load(), h.sizes)
			// On a single node a batch is one script call; on a Cluster
			// (keys in many slots) a pipeline of one per Take.
			if h.keys.Load() != takes {
				t.Errorf("script calls decided %d keys; want one per Take, %d", h.keys.Load(), takes)
			}
			if merged := h.calls.Load() < takes; merged != (tc.nodes == 1) {
				t.Errorf("%d Takes went out in %d script calls; want fewer on a single node, one each on a Cluster", takes, h.calls.Load())
			}
			if sends >= takes {
				t.Errorf("%d Takes from %d goroutines went out in %d writes: nothing was coalesced", takes, goroutines, sends)
			}
			if max := int64(tc.pipelines * tc.nodes); h.maxInFlight.Load() > max {
				t.Errorf("%d writes in flight at once; want at most %d (%d per node)", h.maxInFlight.Load(), max, tc.pipelines)
			}
		})
	}
}

// A Take whose caller gave up while it waited in the queue is never sent,
// so it spends no token.
func TestBatchingDropsAbandonedCalls(t *testing.T) {
	leaktest.Check(t)
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a server of its own to pause")
	}
	client := srv.Client(t)
	sent := make(chan struct{})
	var once sync.Once
	client.AddHook(sendHook(func(cmd redis.Cmder) {
		if args := cmd.Args(); len(args) > 3 && strings.HasSuffix(fmt.Sprint(args[3]), ":first") { // EVALSHA sha 1 key ...
			once.Do(func() { close(sent) })
		}
	}))
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(1))
	limit := store.PerMinute(10)
	if _, err := s.Take(context.Background(), "warm", limit, 1); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	// The only pipeline in flight hangs on the paused server...
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := s.Take(ctx, "first", limit, 1)
		first <- err
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the first Take was never sent")
	}
	// ...so these wait in the queue until their deadline.
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := s.Take(ctx, "abandoned", limit, 1)
		cancel()
		if err == nil {
			t.Fatal("a Take on a paused server answered")
		}
	}
	srv.Resume()
	resumed = true
	if err := <-first; err != nil {
		t.Fatalf("the Take in flight: %v", err)
	}
	// This read queues behind the abandoned Takes, which the worker drops.
	res, err := s.Take(context.Background(), "abandoned", limit, 0)
	if err != nil || res.Remaining != limit.Burst {
		t.Errorf("after 5 abandoned Takes the bucket = %+v, %v; want full (%d)", res, err, limit.Burst)
	}
}

// exitHook panics or ends the goroutine in every command and pipeline it
// sees, according to mode: 0 neither, 1 panic, 2 runtime.Goexit.
type exitHook struct{ mode atomic.Int32 }

func (h *exitHook) act() {
	switch h.mode.Load() {
	case 1:
		panic("hook panics")
	case 2:
		runtime.Goexit()
	}
}

func (h *exitHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *exitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.act()
		}
		return next(ctx, cmd)
	}
}
func (h *exitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.act()
		return next(ctx, cmds)
	}
}

// A client hook that panics, or ends the goroutine with runtime.Goexit,
// neither ends the process nor leaves a caller waiting: a panic comes back
// as an error, on a batching worker as on the caller's goroutine; a Goexit
// on a worker answers its calls with an error at once (on the caller's
// goroutine it ends that goroutine, as it would anywhere). The store works
// again once the hook behaves.
func TestBatchingSurvivesHookThatPanicsOrExits(t *testing.T) {
	leaktest.Check(t)
	client := redistest.Server(t).Client(t)
	h := &exitHook{}
	client.AddHook(h)
	for _, pipelines := range []int{1, 0} {
		s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(pipelines))
		limit := store.PerMinute(1000)
		// crowd runs 32 concurrent Takes and returns the errors of those
		// that failed; a Take still waiting after 5 s fails the test.
		crowd := func(round string) (errs []error, exited int) {
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range 32 {
				wg.Add(1)
				go func() {
					returned := false
					defer func() {
						if !returned {
							mu.Lock()
							exited++
							mu.Unlock()
						}
						wg.Done()
					}()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_, err := s.Take(ctx, fmt.Sprintf("%s:%d", round, i), limit, 1)
					returned = true
					if errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s: a Take waited until its deadline: %v", round, err)
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			return errs, exited
		}
		for _, tc := range []struct {
			mode int32
			want string
		}{{1, "panic: hook panics"}, {2, "runtime.Goexit"}} {
			round := fmt.Sprintf("batching%d-mode%d", pipelines, tc.mode)
			h.mode.Store(tc.mode)
			errs, exited := crowd(round)
			for _, err := range errs {
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %v; want an error saying %q", round, err, tc.want)
				}
			}
			if len(errs)+exited != 32 || (tc.mode == 1 && exited > 0) {
				t.Errorf("%s: %d of 32 Takes failed, %d goroutines ended; want every call to meet the hook, and a panic to come back as an error", round, len(errs), exited)
			}
			h.mode.Store(0)
			if errs, _ := crowd(round + "-after"); len(errs) > 0 {
				t.Errorf("%s, after: %d Takes failed, the first: %v", round, len(errs), errs[0])
			}
		}
	}
}

// On a Cluster, batches are per master: a hung master holds up only the
// keys it serves.
func TestBatchingClusterNodeIsolation(t *testing.T) {
	cl := redistest.Cluster(t)
	client := cl.Client(t)
	prefix := t.Name() + ":"
	s := store.NewRedis(client, store.WithKeyPrefix(prefix), store.WithBatching(2))
	limit := store.PerSecond(1000)
	// One key per master.
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < 3 && i < 1000; i++ {
		k := fmt.Sprintf("k%d", i)
		if m := cl.MasterFor(prefix + k); byMaster[m.Addr] == "" {
			byMaster[m.Addr] = k
		}
	}
	var victim *redistest.Instance
	var healthy []string
	for _, k := range byMaster {
		if victim == nil {
			victim = cl.MasterFor(prefix + k)
			continue
		}
		healthy = append(healthy, k)
	}
	for _, k := range byMaster {
		if _, err := s.Take(context.Background(), k, limit, 1); err != nil {
			t.Fatal(err)
		}
	}
	victimKey := byMaster[victim.Addr]
	victim.Pause()
	defer victim.Resume()
	var wg sync.WaitGroup
	var slowest atomic.Int64
	var failures atomic.Int64
	// Flood the hung master's key so its pipelines stay stuck...
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, _ = s.Take(ctx, victimKey, limit, 1)
		}()
	}
	// ...while the other masters' keys are decided promptly.
	for _, k := range healthy {
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				start := time.Now()
				if _, err := s.Take(ctx, k, limit, 1); err != nil {
					failures.Add(1)
				}
				atomicMax(&slowest, int64(time.Since(start)))
			}()
		}
	}
	wg.Wait()
	t.Logf("healthy masters' keys: slowest %v, %d failures", time.Duration(slowest.Load()), failures.Load())
	if failures.Load() != 0 {
		t.Errorf("%d Takes on healthy masters failed while another master hung; want 0", failures.Load())
	}
	if d := time.Duration(slowest.Load()); d > 150*time.Millisecond {
		t.Errorf("a Take on a healthy master took %v while another master hung; want it unaffected", d)
	}
}

// sendHook calls f for every command sent, alone or in a pipeline.
type sendHook func(redis.Cmder)

func (h sendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h sendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h(cmd)
		return next(ctx, cmd)
	}
}
func (h sendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h(cmd)
		}
		return next(ctx, cmds)
	}
}

// Concurrent Takes of one bucket each get the answer they would have got
// alone: exactly Burst of them are allowed, with every Remaining from
// Burst-1 down to 0 once, including when the crowd meets a bucket with room
// for part of it; each Take's key is in one script call, which it shares.
func TestBatchingTakesOfOneBucket(t *testing.T) {
	for _, tc := range serverAndCluster {
		t.Run(tc.name, func(t *testing.T) {
			leaktest.Check(t)
			client := tc.client(t)
			h := countScripts(client) // first: on a Cluster, it hooks nodes as they are made
			// Loaded, so that no Take meets NOSCRIPT and counts an EVAL too.
			if err := client.ScriptLoad(context.Background(), lua.TokenBucket).Err(); err != nil {
				t.Fatal(err)
			}
			s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(2))
			ctx := context.Background()
			// fire runs goroutines × takes concurrent Takes of cost 1 on key
			// and returns the Remaining of those allowed.
			fire := func(key string, limit store.Limit, goroutines, takes int) []int {
				var mu sync.Mutex
				var allowed []int
				var wg sync.WaitGroup
				for range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range takes {
							res, err := s.Take(ctx, key, limit, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if res.Limit != limit {
								t.Errorf("Limit %v, want %v", res.Limit, limit)
							}
							if res.Allowed {
								mu.Lock()
								allowed = append(allowed, res.Remaining)
								mu.Unlock()
							} else if res.Remaining != 0 || res.RetryAfter <= 0 || res.RetryAfter > limit.Period {
								t.Errorf("denied with %+v; want 0 remaining and a retry within the period", res)
							}
						}
					}()
				}
				wg.Wait()
				return allowed
			}
			// exactly checks that allowed holds want-1 down to 0, once each.
			exactly := func(what string, allowed []int, want int) {
				t.Helper()
				slices.Sort(allowed)
				for i, r := range allowed {
					if r != i {
						t.Fatalf("%s: allowed with Remaining %v; want 0 to %d once each", what, allowed, want-1)
					}
				}
				if len(allowed) != want {
					t.Fatalf("%s: %d allowed; want %d", what, len(allowed), want)
				}
			}

			limit := store.Limit{Rate: 1, Period: time.Hour, Burst: 500}
			calls0, keys0 := h.calls.Load(), h.keys.Load()
			exactly("hot key", fire("hot", limit, 64, 20), limit.Burst)
			calls, keys := h.calls.Load()-calls0, h.keys.Load()-keys0
			t.Logf("1280 Takes of one bucket in %d script calls", calls)
			if keys != 1280 || calls >= keys {
				t.Errorf("1280 concurrent Takes of one bucket were %d keys of %d script calls; want one each, sharing calls", keys, calls)
			}
			// Buckets with room for 3 Takes when the crowd arrives, and
			// buckets smaller than a pipeline's worth of Takes.
			small := store.Limit{Rate: 1, Period: time.Hour, Burst: 4}
			for round := range 5 {
				key := fmt.Sprintf("partial:%d", round)
				if res, err := s.Take(ctx, key, limit, limit.Burst-3); err != nil || !res.Allowed {
					t.Fatalf("draining %s: %+v, %v", key, res, err)
				}
				exactly(key, fire(key, limit, 64, 2), 3)
				key = fmt.Sprintf("small:%d", round)
				exactly(key, fire(key, small, 64, 2), small.Burst)
				key = fmt.Sprintf("small-partial:%d", round)
				if res, err := s.Take(ctx, key, small, 2); err != nil || !res.Allowed {
					t.Fatalf("draining %s: %+v, %v", key, res, err)
				}
				exactly(key, fire(key, small, 64, 2), 2)
			}
		})
	}
}

// A batch sent as one script call that meets NOSCRIPT (the script cache
// flushed just before it) is sent again call by call, each Take counted once.
func TestBatchingMergedCallAfterScriptFlush(t *testing.T) {
	leaktest.Check(t)
	srv := redistest.Server(t)
	client, admin := srv.Client(t), srv.Client(t)
	var flushed atomic.Int64
	client.AddHook(sendHook(func(cmd redis.Cmder) {
		if k, _ := cmd.Args()[2].(int); isScript(cmd) && k > 1 && flushed.Load() < 5 {
			flushed.Add(1)
			admin.ScriptFlush(context.Background())
		}
	}))
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(1))
	ctx := context.Background()
	limit := store.Limit{Rate: 1, Period: time.Hour, Burst: 1000}
	const rounds, goroutines = 5, 64
	for range rounds {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if res, err := s.Take(ctx, "k", limit, 1); err != nil || !res.Allowed {
					t.Errorf("Take = %+v, %v; want allowed", res, err)
				}
			}()
		}
		wg.Wait()
	}
	res, err := s.Take(ctx, "k", limit, 0)
	if want := limit.Burst - rounds*goroutines; err != nil || res.Remaining != want {
		t.Errorf("read back = %+v, %v; want %d remaining: each Take counted once", res, err, want)
	}
	if flushed.Load() == 0 {
		t.Error("no batch went as one script call")
	}
}

// Takes of one hot key on a Cluster share a script call; when its slot has
// moved to another master, that call's MOVED sends each Take again alone
// through the Cluster client, each counted once.
func TestBatchingMergedCallMoved(t *testing.T) {
	leaktest.Check(t)
	cl := redistest.Cluster(t)
	if cl.External {
		t.Skip("moves a slot between masters")
	}
	client := cl.Client(t)
	h := countScripts(client)
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(1))
	ctx := context.Background()
	limit := store.Limit{Rate: 1, Period: time.Hour, Burst: 1000}
	if _, err := s.Take(ctx, "hot", limit, 1); err != nil { // the slot map and the master's batcher
		t.Fatal(err)
	}
	key := s.Key("hot")
	from := cl.MasterFor(key)
	admin := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		return c
	}
	src := admin(from.Addr)
	var dst *redis.Client
	for _, addr := range cl.Addrs {
		if c := admin(addr); addr != from.Addr && c.Do(ctx, "ROLE").Val().([]any)[0] == "master" {
			dst = c
			break
		}
	}
	slot := src.ClusterKeySlot(ctx, key).Val()
	srcID, dstID := src.Do(ctx, "CLUSTER", "MYID").Val(), dst.Do(ctx, "CLUSTER", "MYID").Val()
	host, port, _ := strings.Cut(dst.Options().Addr, ":")
	for _, cmd := range [][]any{
		{dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID},
		{src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID},
		{src, "MIGRATE", host, port, "", 0, 5000, "KEYS", key},
		{dst, "CLUSTER", "SETSLOT", slot, "NODE", dstID},
		{src, "CLUSTER", "SETSLOT", slot, "NODE", dstID},
	} {
		if err := cmd[0].(*redis.Client).Do(ctx, cmd[1:]...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd[1:], err)
		}
	}
	calls0, keys0 := h.calls.Load(), h.keys.Load()
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				res, err := s.Take(ctx, "hot", limit, 1)
				if err != nil {
					t.Errorf("Take after the slot moved: %v", err)
					return
				}
				if res.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res, err := s.Take(ctx, "hot", limit, 0)
	if want := limit.Burst - 1 - 256; err != nil || allowed.Load() != 256 || res.Remaining != want {
		t.Errorf("%d of 256 allowed, read back %+v, %v; want all, %d remaining", allowed.Load(), res, err, want)
	}
	t.Logf("256 Takes: %d script calls of %d keys", h.calls.Load()-calls0, h.keys.Load()-keys0)
}

// holdBatches makes the next script call whose first key ends in ":hold"
// wait until release is called: with one pipeline, the Takes started
// meanwhile queue, and go out together once released.
func holdBatches(t *testing.T, client redis.UniversalClient) (release func()) {
	hold := make(chan struct{})
	var once sync.Once
	hook := sendHook(func(cmd redis.Cmder) {
		if args := cmd.Args(); isScript(cmd) && len(args) > 3 && strings.HasSuffix(fmt.Sprint(args[3]), ":hold") {
			once.Do(func() { <-hold })
		}
	})
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(c *redis.Client) { c.AddHook(hook) })
	} else {
		client.AddHook(hook)
	}
	var closed sync.Once
	release = func() { closed.Do(func() { close(hold) }) }
	t.Cleanup(release)
	return release
}

// A key holding another type fails its own Take only: the Takes merged with
// it are decided, each spending its one token.
func TestBatchingMergedCallWithForeignKey(t *testing.T) {
	leaktest.Check(t)
	client := redistest.Server(t).Client(t)
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(1))
	if err := client.LPush(context.Background(), s.Key("list"), "x").Err(); err != nil {
		t.Fatal(err)
	}
	mergedWithOneBad(t, client, s, "list", "WRONGTYPE")
}

// A merged call the script refuses because of one Take's arguments (which
// Go's validation would have caught: here a client hook spoils them) fails
// that Take alone: the others are sent again, each on its own.
func TestBatchingMergedCallRefusedForOne(t *testing.T) {
	leaktest.Check(t)
	client := redistest.Server(t).Client(t)
	client.AddHook(spoilHook{":bad"})
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(1))
	mergedWithOneBad(t, client, s, "bad", "ERR tollgate:")
}

// mergedWithOneBad queues Takes of bad and four other keys on s (batching 1)
// behind a held pipeline, so that they go out in one merged call, and checks
// that bad's fails with an error holding want and that each other took a token.
func mergedWithOneBad(t *testing.T, client *redis.Client, s *store.Redis, bad, want string) {
	t.Helper()
	ctx := context.Background()
	release := holdBatches(t, client)
	limit := store.PerMinute(10)
	held := make(chan error, 1)
	go func() { _, err := s.Take(ctx, "hold", limit, 1); held <- err }()
	time.Sleep(50 * time.Millisecond) // the hold in flight: the rest queue behind it
	keys := []string{"a0", "a1", bad, "b0", "b1"}
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = s.Take(ctx, k, limit, 1) }()
	}
	time.Sleep(50 * time.Millisecond)
	release()
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if k == bad {
			if errs[i] == nil || !strings.Contains(errs[i].Error(), want) {
				t.Errorf("Take of %q = %v; want an error with %q", k, errs[i], want)
			}
			continue
		}
		res, err := s.Take(ctx, k, limit, 0)
		if errs[i] != nil || err != nil || res.Remaining != limit.Burst-1 {
			t.Errorf("Take %q = %v, read back %+v, %v; want allowed, 1 token spent", k, errs[i], res, err)
		}
	}
}

// spoilHook replaces, in every script call, the cost of each key whose name
// ends with suffix by "x", which the script refuses.
type spoilHook struct{ suffix string }

func (h spoilHook) spoil(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 3 || (args[0] != "evalsha" && args[0] != "eval") {
		return
	}
	n, _ := args[2].(int)
	for i := 0; i < n; i++ { // every group here is one bucket: m, k, cap, q
		if k, _ := args[3+i].(string); strings.HasSuffix(k, h.suffix) {
			args[3+n+4*i+1] = "x"
		}
	}
}

func (h spoilHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h spoilHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.spoil(cmd); return next(ctx, cmd) }
}
func (h spoilHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.spoil(c)
		}
		return next(ctx, cmds)
	}
}

// An invalid group, or a key no group uses, is refused before anything is
// written, whatever groups come before it.
func TestScriptRefusesBeforeWriting(t *testing.T) {
	client := redistest.Server(t).Client(t)
	ctx := context.Background()
	ok := []any{1, 1_000_000, 5_000_000, 1} // a group of one bucket: k, cap, q
	for name, c := range map[string]struct {
		keys []string
		argv []any
	}{
		"k above cap": {[]string{"r:a", "r:b"}, append(append([]any{}, ok...), 1, 9_000_000, 5_000_000, 1)},
		"a key left":  {[]string{"r:c", "r:d"}, ok},
		"bad window":  {[]string{"r:e", "r:f"}, append(append([]any{}, ok...), 1, 1, 5, 0, 4, 3, 2, 1)},
		"no group":    {[]string{"r:g"}, nil},
	} {
		err := client.EvalSha(ctx, lua.TokenBucketSHA1, c.keys, c.argv...).Err()
		if isNoScript(err) {
			client.ScriptLoad(ctx, lua.TokenBucket)
			err = client.EvalSha(ctx, lua.TokenBucketSHA1, c.keys, c.argv...).Err()
		}
		if err == nil || !strings.Contains(err.Error(), "ERR tollgate:") {
			t.Errorf("%s: %v; want an ERR tollgate: reply", name, err)
		}
		if n := client.Exists(ctx, c.keys...).Val(); n != 0 {
			t.Errorf("%s: %d keys written; want none", name, n)
		}
	}
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// Buckets, window quotas, TakeAll groups, refunds and delayed Takes, each on
// keys of their own, queued into one merged script call, answer as they do
// one by one without batching.
func TestBatchingMergedCallMatchesAlone(t *testing.T) {
	for _, tc := range serverAndCluster {
		t.Run(tc.name, func(t *testing.T) {
			leaktest.Check(t)
			client := tc.client(t)
			ctx := context.Background()
			h, b := time.Hour, store.Limit{Rate: 1, Period: time.Hour, Burst: 5}
			fw, sw, pm := store.FixedWindow(7, h), store.SlidingWindow(11, h), store.PerMinute(9)
			// ops decide on the keys {x}<i>:... (one hash tag: one call on a Cluster too).
			type op func(s *store.Redis, k string) ([]store.Result, error)
			one := func(r store.Result, err error) ([]store.Result, error) { return []store.Result{r}, err }
			ops := []op{
				func(s *store.Redis, k string) ([]store.Result, error) { return one(s.Take(ctx, k+"b", b, 2)) },
				func(s *store.Redis, k string) ([]store.Result, error) { return one(s.Take(ctx, k+"w", fw, 7)) },
				func(s *store.Redis, k string) ([]store.Result, error) { return one(s.Take(ctx, k+"w", fw, 8)) },
				func(s *store.Redis, k string) ([]store.Result, error) { return one(s.Take(ctx, k+"s", sw, 3)) },
				func(s *store.Redis, k string) ([]store.Result, error) {
					return s.TakeAll(ctx, []store.Request{{Key: k + "t", Limit: pm, Cost: 1}, {Key: k + "t", Limit: sw, Cost: 3}})
				},
				func(s *store.Redis, k string) ([]store.Result, error) {
					return s.TakeAll(ctx, []store.Request{{Key: k + "a", Limit: b, Cost: 5}, {Key: k + "c", Limit: fw, Cost: 8}})
				},
				func(s *store.Redis, k string) ([]store.Result, error) { return one(s.Refund(ctx, k+"w", fw, 1)) },
				func(s *store.Redis, k string) ([]store.Result, error) {
					return one(s.TakeDelayed(ctx, k+"d", b, 3, 2*h))
				},
				func(s *store.Redis, k string) ([]store.Result, error) { return one(s.Take(ctx, k+"r", b, 0)) },
			}
			summary := func(rs []store.Result, err error) string {
				out := fmt.Sprint(err)
				for _, r := range rs {
					out += fmt.Sprintf(" [%v %v %d %v %v %v]", r.Limit, r.Allowed, r.Remaining,
						r.RetryAfter.Round(time.Minute), r.Delay.Round(time.Minute), r.ResetAfter.Round(time.Minute))
				}
				return out
			}
			alone := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":alone:"), store.WithBatching(0))
			var want []string
			for i, o := range ops {
				want = append(want, summary(o(alone, fmt.Sprintf("{x}%d:", i))))
			}
			release := holdBatches(t, client)
			s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":merged:"), store.WithBatching(1))
			if _, err := s.Take(ctx, "{x}warm", pm, 1); err != nil { // the slot map, on a Cluster
				t.Fatal(err)
			}
			held := make(chan error, 1)
			go func() { _, err := s.Take(ctx, "{x}hold", pm, 1); held <- err }()
			time.Sleep(50 * time.Millisecond)
			got := make([]string, len(ops))
			var wg sync.WaitGroup
			for i, o := range ops {
				wg.Add(1)
				go func() { defer wg.Done(); got[i] = summary(o(s, fmt.Sprintf("{x}%d:", i))) }()
			}
			time.Sleep(50 * time.Millisecond)
			release()
			wg.Wait()
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			for i := range ops {
				if got[i] != want[i] {
					t.Errorf("op %d batched:\n got %s\nwant %s", i, got[i], want[i])
				}
			}
		})
	}
}
