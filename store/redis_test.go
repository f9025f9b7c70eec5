package store_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
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
	// A key of the hashed form is hashed too: no caller's key is stored
	// under the hashed form of another.
	if forged := strings.TrimPrefix(got, store.DefaultKeyPrefix); s.Key(forged) == got {
		t.Errorf("Key(%q) = %q, the Redis key of a long key", forged, got)
	}
}

// On a Cluster (or Ring) client the store puts its own hash tag in front
// of every key: keys with the same first "{...}" share it, so that TakeAll
// decides them together, and a caller's braces cannot name a slot.
func TestRedisClusterKeys(t *testing.T) {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{redistest.ClosedAddr(t)}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := store.NewRedis(client)
	tagOf := func(key string) string {
		k := s.Key(key)
		if !strings.HasPrefix(k, store.DefaultKeyPrefix+"{") || len(k) < len(store.DefaultKeyPrefix)+10 || k[len(store.DefaultKeyPrefix)+9] != '}' {
			t.Fatalf("Key(%q) = %q; want the prefix, a tag of 8 characters, then the key", key, k)
		}
		return k[len(store.DefaultKeyPrefix)+1 : len(store.DefaultKeyPrefix)+9]
	}
	if got := s.Key("api:1.2.3.4"); !strings.HasSuffix(got, "}api:1.2.3.4") {
		t.Errorf("Key(api:1.2.3.4) = %q; want the caller's key after the tag", got)
	}
	if tagOf("{user:42}:10/s") != tagOf("{user:42}:1000/h") || tagOf("{user:42}:10/s") == tagOf("{user:43}:10/s") {
		t.Error("keys with the same {...} must share a tag, others not")
	}
	// The tag is the store's: a subject that names a tag of its own does
	// not get it.
	for _, subject := range []string{"{x}", "x}{y", "{" + tagOf("a") + "}"} {
		if k := s.Key("api:" + subject); strings.Contains(k[:len(store.DefaultKeyPrefix)+10], subject) {
			t.Errorf("Key(api:%s) = %q; want a tag that is not the subject's", subject, k)
		}
	}
	long := "{user:42}" + strings.Repeat("x", 200)
	if tagOf(long) != tagOf("{user:42}:10/s") || len(s.Key(long)) > len(store.DefaultKeyPrefix)+10+32 {
		t.Errorf("Key(long, tagged) = %q; want its group's tag and the hashed key", s.Key(long))
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
	for _, pipelines := range []int{store.DefaultBatchPipelines, 0} {
		t.Run(fmt.Sprintf("batching=%d", pipelines), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 5 * time.Second,
				MaxRetries: -1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			s := store.NewRedis(client, store.WithBatching(pipelines))
			for range 3 {
				failsWithin(t, s, 50*time.Millisecond, 70*time.Millisecond)
			}
			// A crowd sharing one context, as under middleware's shared budget,
			// alone and queued into pipelines.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := s.Take(ctx, fmt.Sprint("k", i), store.PerSecond(1), 1); err == nil {
						t.Error("Take on a hung Redis succeeded")
					}
				}()
			}
			wg.Wait()
			if elapsed := time.Since(start); elapsed > 250*time.Millisecond { // not the 5s ReadTimeout
				t.Errorf("16 Takes sharing a 50ms deadline returned after %v", elapsed)
			}
		})
	}
}

// A client that would hold a call past its context's deadline is refused by
// Validate (so by middleware.New), with an error that says what to set.
func TestRedisValidateDeadlines(t *testing.T) {
	const ctxTimeout, off = "ContextTimeoutEnabled", "-2"
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		want   string // what the error names; "" for none
	}{
		{"client", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), ctxTimeout},
		{"client with ContextTimeoutEnabled", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), ""},
		{"failover", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), ctxTimeout},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), ctxTimeout},
		{"cluster with ContextTimeoutEnabled", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), ""},
		{"ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), ctxTimeout},
		{"universal", redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), ""},
		// A timeout of -2 turns go-redis's socket deadlines off, the context's too: a
		// SIGSTOPped Redis held requests for the whole stall. -1 keeps the context's.
		{"client read -2", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: -2}), off},
		{"client write -2", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, WriteTimeout: -2}), off},
		{"client -1", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1}), ""},
		{"cluster -2", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true, ReadTimeout: -2}), off},
		{"cluster -1", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true, ReadTimeout: -1}), ""},
		{"ring -2", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true, WriteTimeout: -2}), off},
		{"ring -1", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true, ReadTimeout: -1}), ""},
		{"failover -2", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true, ReadTimeout: -2}), off},
	} {
		t.Cleanup(func() { tc.client.Close() })
		err := store.NewRedis(tc.client).Validate()
		if tc.want == "" && err != nil {
			t.Errorf("%s: Validate = %v; want nil", tc.name, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v; want an error naming %s", tc.name, err, tc.want)
		}
	}
	if err := store.NewRedis(redis.NewClient(&redis.Options{ContextTimeoutEnabled: true}), store.WithBatching(-1)).Validate(); err == nil {
		t.Error("Validate with WithBatching(-1) = nil; want an error")
	}
	// A brace in the prefix would pick the slot of a Cluster's keys.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer cc.Close()
	for _, p := range []string{"{app}:", "{}x:", "a}"} {
		s := store.NewRedis(cc, store.WithKeyPrefix(p))
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "brace") {
			t.Errorf("Validate on a Cluster with prefix %q = %v; want an error about the brace", p, err)
		}
		if k := s.Key("a"); !strings.HasPrefix(k, store.DefaultKeyPrefix) { // ignored, as Validate says
			t.Errorf("Key(a) with prefix %q refused = %q; want the default prefix", p, k)
		}
	}
	if err := store.NewRedis(cc, store.WithKeyPrefix("app:")).Validate(); err != nil {
		t.Errorf("Validate on a Cluster with prefix app: = %v", err)
	}
	single := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true})
	defer single.Close()
	if err := store.NewRedis(single, store.WithKeyPrefix("{app}:")).Validate(); err != nil {
		t.Errorf("Validate on a single node with prefix {app}: = %v; want nil (no slots)", err)
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
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ReadTimeout: time.Second, ContextTimeoutEnabled: true})
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
	// With batching or without, a panic in a client hook comes back as an
	// error.
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

// Check says what keeps the store from deciding on a real server whose ACL
// forbids the script (EVALSHA and EVAL), or a command inside it (SET), and
// nothing on a server that allows them.
func TestRedisCheckACL(t *testing.T) {
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a redis-server of its own to add ACL users to")
	}
	admin := srv.Client(t)
	ctx := context.Background()
	for user, rules := range map[string][]any{
		"noscript": {"-evalsha", "-eval"},
		"noset":    {"-set"},
	} {
		args := append([]any{"ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "+@all"}, rules...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s: %v", user, err)
		}
	}
	client := func(user string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: user, Password: "pw", ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	if err := store.NewRedis(srv.Client(t)).Check(ctx); err != nil {
		t.Errorf("Check with the default user: %v, want nil", err)
	}
	for _, user := range []string{"noscript", "noset"} {
		err := store.NewRedis(client(user)).Check(ctx)
		if err == nil || !strings.Contains(err.Error(), "grant +evalsha +eval +time +get +set +del") {
			t.Errorf("Check as %s: %v; want an error naming what to grant", user, err)
		}
		t.Logf("Check as %s: %v", user, err)
	}
}

// A reply later than the client's ReadTimeout, with go-redis's retries on
// (MaxRetries, or a Cluster's MaxRedirects, left at their defaults): go-redis
// would send the call again, and Redis, busy meanwhile with a slow command,
// would run every copy, taking a Take's tokens more than once. The store ends
// a call at the ReadTimeout, alone or in a pipeline, so that no copy is sent:
// one token per Take. Real servers, a node and a Cluster.
func TestRedisLateReplyTakenOnce(t *testing.T) {
	t.Parallel()
	t.Run("node", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Server(t)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 20 * time.Millisecond, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		lateTakenOnce(t, client, []string{srv.Addr})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.Cluster(t)
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ReadTimeout: 20 * time.Millisecond, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		lateTakenOnce(t, client, cl.Addrs)
	})
	t.Run("ring", func(t *testing.T) {
		t.Parallel()
		a, b := redistest.Server(t), redistest.Server(t)
		client := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr},
			ReadTimeout: 20 * time.Millisecond, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		lateTakenOnce(t, client, []string{a.Addr, b.Addr})
	})
}

// A Take whose context cannot end (Background, or values only) is still
// bound to end by the ReadTimeout when the client retries, alone and in a
// pipeline, and the client's hooks still see its values; with retries off
// the store adds no deadline.
func TestRedisBoundKeepsValues(t *testing.T) {
	type key struct{}
	mr := miniredis.RunT(t)
	for _, tc := range []struct {
		name    string
		retries int
		bounded bool
	}{{"retries", 0, true}, {"no retries", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			const read = 500 * time.Millisecond
			client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ReadTimeout: read, MaxRetries: tc.retries, ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			var mu sync.Mutex
			var seen []string
			var want any // the round's value
			client.AddHook(ctxHook(func(ctx context.Context) {
				d, ok := ctx.Deadline()
				left := time.Until(d)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case ok != tc.bounded:
					seen = append(seen, fmt.Sprintf("deadline %v, want %v", ok, tc.bounded))
				case ok && (left <= 0 || left > read):
					seen = append(seen, fmt.Sprintf("deadline in %v, want within (0, %v]", left, read))
				}
				if v := ctx.Value(key{}); v != want {
					seen = append(seen, fmt.Sprintf("value %v, want %v", v, want))
				}
			}))
			s := store.NewRedis(client)
			lim := store.PerSecond(1000)
			for _, v := range []any{nil, "v"} {
				ctx := context.Background()
				if v != nil {
					ctx = context.WithValue(ctx, key{}, v)
				}
				mu.Lock()
				want = v
				mu.Unlock()
				var wg sync.WaitGroup
				for i := range 32 { // one alone, then pipelines
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := s.Take(ctx, fmt.Sprint("k", i), lim, 1); err != nil {
							t.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			mu.Lock()
			defer mu.Unlock()
			for _, msg := range slices.Compact(seen) {
				t.Error(msg)
			}
		})
	}
}

// ctxHook calls f with the context of every command or pipeline sent.
type ctxHook func(context.Context)

func (h ctxHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h ctxHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h(ctx); return next(ctx, cmd) }
}
func (h ctxHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h(ctx); return next(ctx, cmds) }
}

// lateTakenOnce makes every server at addrs run a script for 300 ms while
// 9 Takes go through client, then checks what each took.
func lateTakenOnce(t *testing.T, client redis.UniversalClient, addrs []string) {
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"), store.WithBatching(1))
	lim, ctx := store.PerHour(10), context.Background()
	for i := range 8 { // the script loaded on every server
		if _, err := s.Take(ctx, fmt.Sprint("warm", i), lim, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Connections in use before, as in a busy app: a copy goes out at once.
	pings := func(ctx context.Context, c redis.Cmdable) {
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() { defer wg.Done(); c.Ping(ctx) }()
		}
		wg.Wait()
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { pings(ctx, c); return nil })
	case *redis.Ring:
		c.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { pings(ctx, c); return nil })
	default:
		pings(ctx, client)
	}
	slow := make(chan error, len(addrs))
	for _, addr := range addrs { // a slow command, as SCAN or KEYS can be, on every server
		busy := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 5 * time.Second})
		t.Cleanup(func() { busy.Close() })
		go func() {
			slow <- busy.Eval(ctx, `local t = redis.call('TIME') local s = t[1] * 1e6 + t[2]
				repeat local u = redis.call('TIME') until u[1] * 1e6 + u[2] - s > 300000 return 1`, nil).Err()
		}()
	}
	time.Sleep(50 * time.Millisecond) // the slow scripts are running
	var wg sync.WaitGroup
	for i := range 9 { // one alone, the others queued into a pipeline
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A deadline later than the ReadTimeout, none, or none and a cancel.
			tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			switch i % 3 {
			case 1:
				tctx = ctx
			case 2:
				tctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			s.Take(tctx, fmt.Sprint("k", i), lim, 1) // an error: the reply is late
		}()
	}
	wg.Wait()
	for range addrs {
		if err := <-slow; err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // Redis done with what it received
	for i := range 9 {
		res, err := store.Inspect(ctx, s, fmt.Sprint("k", i), lim, 0)
		if err != nil {
			t.Fatal(err)
		}
		if taken := lim.Burst - res.Remaining; taken > 1 {
			t.Errorf("k%d: %d tokens taken by one Take whose reply was late; want at most 1", i, taken)
		}
	}
}
