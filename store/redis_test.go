package store_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/lua"
	"github.com/tollgate-go/tollgate/store"
)

func TestRedisClockDecides(t *testing.T) {
	// The process clock does not move in this test; only Redis's does.
	_, client, advance := newMiniredis(t)
	s := store.NewRedis(client)
	ctx := context.Background()
	lim := store.PerMinute(2)
	for i := range 2 {
		if r, err := s.Take(ctx, "k", lim, 1); err != nil || !r.Allowed {
			t.Fatalf("take %d = %+v, %v; want allowed", i, r, err)
		}
	}
	if r, _ := s.Take(ctx, "k", lim, 1); r.Allowed {
		t.Fatalf("third take allowed; want denied")
	}
	advance(30 * time.Second) // Redis's TIME moves half a minute: one token
	r, err := s.Take(ctx, "k", lim, 1)
	if err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("after Redis's clock moved 30s: %+v, %v; want allowed with 0 remaining", r, err)
	}
}

func TestRedisKeyAndTTL(t *testing.T) {
	mr, client, advance := newMiniredis(t)
	s := store.NewRedis(client, store.WithKeyPrefix("app:"))
	ctx := context.Background()
	lim := store.Limit{Rate: 1, Period: 3 * time.Second, Burst: 2}

	if r, err := s.Take(ctx, "login:1.2.3.4", lim, 0); err != nil || !r.Allowed || r.Remaining != 2 {
		t.Fatalf("peek = %+v, %v", r, err)
	}
	if mr.Exists("app:login:1.2.3.4") {
		t.Fatal("cost 0 created a key; want no write")
	}
	if _, err := s.Take(ctx, "login:1.2.3.4", lim, 1); err != nil {
		t.Fatal(err)
	}
	if got, want := mr.TTL("app:login:1.2.3.4"), 3*time.Second; got != want {
		t.Errorf("TTL after one take = %v, want %v (time until full)", got, want)
	}
	if _, err := s.Take(ctx, "login:1.2.3.4", lim, 1); err != nil {
		t.Fatal(err)
	}
	if got, want := mr.TTL("app:login:1.2.3.4"), 6*time.Second; got != want {
		t.Errorf("TTL after two takes = %v, want %v", got, want)
	}
	before, _ := mr.Get("app:login:1.2.3.4")
	if r, _ := s.Take(ctx, "login:1.2.3.4", lim, 1); r.Allowed {
		t.Fatal("third take allowed; want denied")
	}
	if after, _ := mr.Get("app:login:1.2.3.4"); after != before {
		t.Errorf("denial changed the state from %q to %q; want no write", before, after)
	}
	advance(6 * time.Second)
	if mr.Exists("app:login:1.2.3.4") {
		t.Error("key still exists once its bucket is full again")
	}
}

func TestRedisKeyHashing(t *testing.T) {
	s := store.NewRedis(nil)
	if got := s.Key("short"); got != "tollgate:short" {
		t.Errorf("Key(short) = %q", got)
	}
	long := strings.Repeat("a", 129)
	got := s.Key(long)
	if len(got) > len(store.DefaultKeyPrefix)+64 || !strings.HasPrefix(got, store.DefaultKeyPrefix+"#") {
		t.Errorf("Key(129 bytes) = %q; want the prefix and a short hash", got)
	}
	if s.Key(long) != got || s.Key(long+"b") == got {
		t.Error("hashing is not a function of the whole key")
	}
	tagged := "{user:42}" + strings.Repeat("x", 200)
	if got := s.Key(tagged); !strings.HasPrefix(got, store.DefaultKeyPrefix+"{user:42}#") {
		t.Errorf("Key(tagged long) = %q; want the hash tag kept", got)
	}
}

func TestRedisScriptFlushed(t *testing.T) {
	_, client, _ := newMiniredis(t)
	s := store.NewRedis(client)
	ctx := context.Background()
	for i := range 3 {
		client.ScriptFlush(context.Background())
		r, err := s.Take(ctx, "k", store.PerMinute(10), 1)
		if err != nil || !r.Allowed || r.Remaining != 9-i {
			t.Fatalf("take %d after SCRIPT FLUSH = %+v, %v", i, r, err)
		}
	}
}

// rewordingProxy forwards TCP to addr and rewrites Redis's NOSCRIPT error the
// way some proxies do, to prove the EVAL fallback does not depend on the
// exact wording.
func rewordingProxy(t *testing.T, addr string, from, to []byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(up, c); up.Close() }()
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(up)
				for {
					line, err := r.ReadBytes('\n')
					if len(line) > 0 {
						c.Write(bytes.Replace(line, from, to, 1))
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestRedisNoScriptReworded(t *testing.T) {
	for _, tc := range []struct{ name, to string }{
		{"prefixed", "-ERR NOSCRIPT No matching script. Please use EVAL."},
		{"lowercase", "-ERR proxy: upstream said noscript"},
		{"no code", "-ERR no matching script, use EVAL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr, _, _ := newMiniredis(t)
			addr := rewordingProxy(t, mr.Addr(), []byte("-NOSCRIPT No matching script. Please use EVAL."), []byte(tc.to))
			client := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { client.Close() })
			// Make sure the error really is reworded on its way.
			err := client.EvalSha(context.Background(), lua.TokenBucketSHA1, []string{"x"}, 1, 1, 1, 1).Err()
			if err == nil || strings.HasPrefix(err.Error(), "NOSCRIPT") {
				t.Fatalf("EVALSHA through the proxy = %v; want a reworded error", err)
			}
			client.ScriptFlush(context.Background())
			s := store.NewRedis(client)
			r, err := s.Take(context.Background(), "k", store.PerMinute(10), 1)
			if err != nil || !r.Allowed {
				t.Fatalf("Take through the proxy = %+v, %v; want allowed", r, err)
			}
		})
	}
}

func TestRedisErrorsAreWrapped(t *testing.T) {
	// A closed port: a network error, returned (never a decision), quickly.
	client := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := store.NewRedis(client)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := s.Take(ctx, "k", store.PerSecond(1), 1)
	if err == nil || r.Allowed {
		t.Fatalf("Take on a closed port = %+v, %v; want an error", r, err)
	}
	if !strings.HasPrefix(err.Error(), `store: take "k": `) {
		t.Errorf("error %q lacks the package prefix and key", err)
	}
}

func TestRedisTakeReturnsByDeadline(t *testing.T) {
	addr := redistest.HangingAddr(t)
	for _, ctxTimeouts := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeouts), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 5 * time.Second,
				MaxRetries: -1, ContextTimeoutEnabled: ctxTimeouts})
			t.Cleanup(func() { client.Close() })
			s := store.NewRedis(client)
			for range 3 {
				failsWithin(t, s, 50*time.Millisecond, 70*time.Millisecond)
			}
		})
	}
}

// failsWithin checks that a Take on s, which cannot reach Redis, fails
// within limit when its deadline is budget away.
func failsWithin(t *testing.T, s *store.Redis, budget, limit time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	_, err := s.Take(ctx, "k", store.PerSecond(1), 1)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("Take on a hung Redis succeeded")
	}
	if elapsed > limit {
		t.Errorf("Take with a %v deadline returned after %v (%v)", budget, elapsed, err)
	}
}

// A Cluster client that has not loaded its slot map yet asks a node for it
// on the first Take; with every node hung, that Take still returns by its
// deadline, with batching or without, and so does the next.
func TestRedisClusterFirstTakeReturnsByDeadline(t *testing.T) {
	cl := redistest.Cluster(t)
	if cl.External {
		t.Skip("needs a Cluster of its own to pause")
	}
	for _, n := range cl.Nodes {
		n.Pause()
	}
	defer func() {
		for _, n := range cl.Nodes {
			n.Resume()
		}
	}()
	for _, pipelines := range []int{store.DefaultBatchPipelines, 0} {
		t.Run(fmt.Sprintf("batching=%d", pipelines), func(t *testing.T) {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ReadTimeout: time.Second})
			t.Cleanup(func() { client.Close() })
			s := store.NewRedis(client, store.WithBatching(pipelines))
			for range 2 {
				failsWithin(t, s, 50*time.Millisecond, 150*time.Millisecond)
			}
		})
	}
}

// A TakeAll across two Cluster masters returns by its deadline when the
// second master hangs: whether the first tag was denied (the second is then
// only read) or allowed (its tokens are then given back, in the background
// if need be).
func TestRedisTakeAllAcrossMastersReturnsByDeadline(t *testing.T) {
	cl := redistest.Cluster(t)
	if cl.External {
		t.Skip("needs a Cluster of its own to pause")
	}
	client := cl.Client(t)
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"))
	ctx := context.Background()
	lim := store.PerMinute(1)
	// twoKeys returns keys on two different masters, and the second's.
	twoKeys := func(round string) (k1, k2 string, second *redistest.Instance) {
		k1 = "{" + round + "-a}x"
		for _, tag := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
			k2 = "{" + round + "-" + tag + "}y"
			if m := cl.MasterFor(s.Key(k2)); m != cl.MasterFor(s.Key(k1)) {
				return k1, k2, m
			}
		}
		t.Fatal("no two keys on different masters")
		return
	}
	for _, tc := range []struct {
		round       string
		firstDenied bool
	}{{"denied", true}, {"refund", false}} {
		k1, k2, second := twoKeys(tc.round)
		if tc.firstDenied {
			if _, err := s.Take(ctx, k1, lim, 1); err != nil { // empties k1
				t.Fatal(err)
			}
		}
		second.Pause()
		tctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		start := time.Now()
		res, err := s.TakeAll(tctx, []store.Request{{Key: k1, Limit: lim, Cost: 1}, {Key: k2, Limit: lim, Cost: 1}})
		elapsed := time.Since(start)
		cancel()
		second.Resume()
		// Calls after a denial ran under a deadline of their own, 100 ms.
		if elapsed > 90*time.Millisecond {
			t.Errorf("%s: TakeAll with a 30ms deadline returned after %v (%+v, %v)", tc.round, elapsed, res, err)
		}
		if tc.firstDenied && (err != nil || res[0].Allowed || res[1].Allowed) {
			t.Errorf("%s: TakeAll = %+v, %v; want both denied", tc.round, res, err)
		}
		if !tc.firstDenied {
			if err == nil {
				t.Errorf("%s: TakeAll on a hung master = %+v; want an error", tc.round, res)
			}
			// The first tag's token comes back, though the caller has gone.
			deadline := time.Now().Add(2 * time.Second)
			for {
				r, err := s.Take(ctx, k1, lim, 0)
				if err == nil && r.Remaining == lim.Burst {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s after the failed TakeAll: %+v, %v; want its token given back", tc.round, k1, r, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

// panicHook makes every command panic, like a broken client hook.
type panicHook struct{}

func (panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (panicHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(context.Context, redis.Cmder) error { panic("hook exploded") }
}
func (panicHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(context.Context, []redis.Cmder) error { panic("hook exploded") }
}

func TestRedisTakeNeverPanics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, nilClient := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		s := store.NewRedis(nilClient)
		r, err := s.Take(ctx, "k", store.PerSecond(1), 1)
		if err == nil || r.Allowed {
			t.Errorf("Take on a nil client (%T) = %+v, %v; want an error", nilClient, r, err)
		}
		if s.Validate() == nil {
			t.Errorf("Validate on a nil client (%T) = nil; want an error", nilClient)
		}
	}
	_, client, _ := newMiniredis(t)
	client.AddHook(panicHook{})
	// With batching, calls run on the batcher's goroutines; without, with
	// a deadline and a client that ignores it, Take runs the call on a
	// goroutine of its own: a panic there must come back as an error.
	for _, n := range []int{store.DefaultBatchPipelines, 0} {
		r, err := store.NewRedis(client, store.WithBatching(n)).Take(ctx, "k", store.PerSecond(1), 1)
		if err == nil || !strings.Contains(err.Error(), "panic: hook exploded") {
			t.Errorf("WithBatching(%d): Take through a panicking hook = %+v, %v; want the panic as an error", n, r, err)
		}
	}
}

// A TTL of 10^8 ms or more goes to SET as digits (Redis 7.2.0 to 7.2.4 would
// send a Lua number such as 1e8 as "1e+08", which SET refuses), in the
// script's fast path (the rate divides the period) and in its general path.
func TestRedisLongTTL(t *testing.T) {
	client := redistest.Server(t).Client(t)
	s := store.NewRedis(client, store.WithKeyPrefix("ttl:"))
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		limit store.Limit
		want  time.Duration
	}{
		{"exactly 1e8 ms", store.Limit{Rate: 1, Period: 100_000 * time.Second, Burst: 1}, 100_000 * time.Second},
		{"2e8 ms", store.Limit{Rate: 1, Period: 200_000 * time.Second, Burst: 2}, 200_000 * time.Second},
		{"fraction", store.Limit{Rate: 3, Period: 300_000*time.Second + time.Microsecond, Burst: 1}, 100_000*time.Second + time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := s.Take(ctx, c.name, c.limit, 1)
			if err != nil || !r.Allowed {
				t.Fatalf("Take = %+v, %v", r, err)
			}
			ttl, err := client.PTTL(ctx, "ttl:"+c.name).Result()
			if err != nil || ttl > c.want || ttl < c.want-time.Second {
				t.Errorf("PTTL = %v, %v; want about %v", ttl, err, c.want)
			}
			if r, err := s.Take(ctx, c.name, c.limit, 0); err != nil || r.ResetAfter <= c.want-time.Second {
				t.Errorf("read back = %+v, %v; want the bucket %v from full", r, err, c.want)
			}
		})
	}
}

// argCounter records the number of ARGV of the last script call.
type argCounter struct{ argv atomic.Int64 }

func (h *argCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *argCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.argv.Store(int64(len(cmd.Args()) - 4)) // EVALSHA sha numkeys key ARGV...
		}
		return next(ctx, cmd)
	}
}
func (h *argCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The store decides one key with the script's one-key form when the limit
// fits it; the general form, given the same decisions on the same clock,
// answers the same and leaves the same state and TTL — so the two can share
// a key (a Take, and a TakeAll of several keys).
func TestRedisScriptFormsAgree(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit store.Limit
		argv  int64 // the form Take uses: 2 or 3 (one-key), 4 (general)
	}{
		{"rate divides period", store.PerMinute(10), 2},
		{"fraction", store.Limit{Rate: 3, Period: time.Second, Burst: 5}, 3},
		{"benchmark's", store.Limit{Rate: 10_000_000, Period: time.Second, Burst: 100_000_000}, 3},
		{"fraction, long TTL", store.Limit{Rate: 7, Period: 1_000_000*time.Second + time.Microsecond, Burst: 3}, 3},
		{"capacity above 2^50 units", store.Limit{Rate: 999_983, Period: 1000 * time.Second, Burst: 2_000_000}, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			mr, client, advance := newMiniredis(t)
			h := &argCounter{}
			client.AddHook(h)
			s := store.NewRedis(client, store.WithBatching(0))
			ctx := context.Background()
			lim := c.limit
			period := lim.Period.Microseconds()
			rng := rand.New(rand.NewPCG(1, uint64(lim.Rate)))
			for i := range 300 {
				advance(time.Duration(rng.Int64N(int64(lim.Period)/int64(lim.Rate)*3+1)) / time.Microsecond * time.Microsecond)
				cost := []int{0, 1, 1, 1, 2, lim.Burst, rng.IntN(lim.Burst + 1), -1, -rng.IntN(lim.Burst + 1)}[rng.IntN(9)]
				var got store.Result
				var err error
				if cost >= 0 {
					got, err = s.Take(ctx, "a", lim, cost)
				} else {
					got, err = s.Refund(ctx, "a", lim, -cost)
				}
				if err != nil {
					t.Fatalf("op %d: cost %d: %v", i, cost, err)
				}
				if n := h.argv.Load(); n != c.argv {
					t.Fatalf("op %d: the script got %d arguments; want %d", i, n, c.argv)
				}
				reply, err := client.EvalSha(ctx, lua.TokenBucketSHA1, []string{"tollgate:b"},
					lim.Rate, period, lim.Burst, cost).Int64Slice()
				if err != nil || len(reply) != 4 {
					t.Fatalf("op %d: general form: %v, %v", i, reply, err)
				}
				want := store.Result{Limit: lim, Allowed: reply[0] == 1, Remaining: int(reply[1]),
					RetryAfter: time.Duration(reply[2]) * time.Microsecond, ResetAfter: time.Duration(reply[3]) * time.Microsecond}
				if got != want {
					t.Fatalf("op %d: cost %d: one-key form %+v, general form %+v", i, cost, got, want)
				}
				va, _ := mr.Get("tollgate:a")
				vb, _ := mr.Get("tollgate:b")
				if va != vb || mr.TTL("tollgate:a") != mr.TTL("tollgate:b") {
					t.Fatalf("op %d: cost %d: state %q TTL %v, general form's %q TTL %v", i, cost,
						va, mr.TTL("tollgate:a"), vb, mr.TTL("tollgate:b"))
				}
			}
		})
	}
}

// The one-key form reads back what it wrote whatever decimal text its Q came
// as: a client in another language may send "3.0" or "03".
func TestRedisScriptQAsText(t *testing.T) {
	for _, q := range []string{"3", "3.0", "03", " 3"} {
		t.Run(q, func(t *testing.T) {
			_, client, _ := newMiniredis(t)
			ctx := context.Background()
			// 3 tokens per 5 µs, burst 3: t = 5 units of 1/3 µs, cap = 15.
			for i, want := range []int64{5, 10, 15, -16} {
				got, err := client.EvalSha(ctx, lua.TokenBucketSHA1, []string{"k"}, 15, 5, q).Int64()
				if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
					got, err = client.Eval(ctx, lua.TokenBucket, []string{"k"}, 15, 5, q).Int64()
				}
				if err != nil || got != want {
					t.Fatalf("call %d = %d, %v; want %d (state %q)", i, got, err, want, client.Get(ctx, "k").Val())
				}
				if v := client.Get(ctx, "k").Val(); i == 0 && !strings.HasSuffix(v, "+2/3") {
					t.Errorf("state %q after 5/3 µs of debt; want the fraction as +2/3", v)
				}
			}
		})
	}
}
