package bench_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/bench/peers"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/store"
)

var (
	batchingFlag = flag.String("batching", "0,4",
		"comma-separated n of the tollgate-batch<n> variants on Redis, with store.WithBatching(n) "+
			"(empty for none)")
	poolFlag = flag.Int("pool", 64, "PoolSize of every go-redis client")
)

// The limits: generous for the hot and spread workloads, so that every
// decision is allowed, and 100/s for the denied one, so that nearly every
// decision is refused. The generous bucket holds 10^8 tokens and refills in
// 10 s: an in-memory store deciding millions of times a second would drain
// 1,000,000/s burst 1,000,000 within a run and measure its denials, and a
// bucket that refills within milliseconds would turn scheduling delays into
// denials.
var (
	generous = store.Limit{Rate: 10_000_000, Period: time.Second, Burst: 100_000_000}
	tight    = store.PerSecond(100)
)

const spreadKeyCount = 100_000

var spreadKeys = func() []string {
	k := make([]string, spreadKeyCount)
	for i := range k {
		k[i] = "k:" + strconv.Itoa(i)
	}
	return k
}()

// workload is a stream of keys under a limit.
type workload struct {
	name  string
	limit store.Limit
	// key returns the key of the i-th decision of a goroutine that starts
	// at offset start.
	key func(start, i int) string
}

var workloads = []workload{
	{"hot", generous, func(int, int) string { return "hot" }},
	{"spread", generous, func(start, i int) string {
		// A prime stride visits every key before repeating one.
		return spreadKeys[(start+i*7919)%spreadKeyCount]
	}},
	{"denied", tight, func(int, int) string { return "denied" }},
}

var goroutines = []int{1, 16, 64}

// variant is a library with its options.
type variant struct {
	name     string
	lib      string
	batching *int
}

func variants(b *testing.B, backend string) []variant {
	var vs []variant
	for _, lib := range peers.Libs(backend) {
		vs = append(vs, variant{name: lib, lib: lib})
		if lib != peers.Tollgate || backend != peers.Redis {
			continue
		}
		if *batchingFlag == "" {
			continue
		}
		for _, f := range strings.Split(*batchingFlag, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				b.Fatalf("-batching: %q is not a count of pipelines", f)
			}
			vs = append(vs, variant{name: fmt.Sprintf("tollgate-batch%d", n), lib: lib, batching: &n})
		}
	}
	return vs
}

// BenchmarkDecide runs one decision of cost 1 per op through every library,
// in memory and on a real redis-server on loopback (REDIS_ADDR, or one
// started for the benchmark), from 1, 16 and 64 goroutines, on one hot key,
// over 100,000 keys, and on one key that is nearly always denied.
//
// Names are BenchmarkDecide/<backend>/<lib>/<workload>/g<goroutines>; the
// decisions/s metric is b.N over the elapsed time, allowed/op the share of
// decisions allowed and errors/op the share that failed (for example
// throttled giving up after 10 compare-and-swap attempts).
func BenchmarkDecide(b *testing.B) {
	for _, backend := range []string{peers.Memory, peers.Redis} {
		b.Run(backend, func(b *testing.B) {
			var addr string
			if backend == peers.Redis {
				addr = redistest.Server(b).Addr
			}
			for _, v := range variants(b, backend) {
				b.Run(v.name, func(b *testing.B) {
					var client *redis.Client
					if addr != "" {
						// ContextTimeoutEnabled, as tollgate's store requires; every
						// library gets the same client options.
						client = redis.NewClient(&redis.Options{Addr: addr, PoolSize: *poolFlag, ContextTimeoutEnabled: true})
						b.Cleanup(func() { client.Close() })
					}
					for _, w := range workloads {
						b.Run(w.name, func(b *testing.B) {
							d, err := peers.NewDecider(peers.Config{
								Lib: v.lib, Backend: backend, Client: client,
								Limit: w.limit, Batching: v.batching,
							})
							if err != nil {
								b.Fatal(err)
							}
							b.Cleanup(func() { d.Close() })
							warm(b, d)
							if backend == peers.Memory && w.name == "spread" {
								touch(b, d)
							}
							for _, g := range goroutines {
								b.Run("g"+strconv.Itoa(g), func(b *testing.B) { decide(b, d, w, g) })
							}
						})
					}
				})
			}
		})
	}
}

// touch decides once on every spread key, so that the in-memory stores
// measure decisions on known keys: otherwise the first timed run of a
// process, at 1 goroutine, mostly makes buckets (an allocation and an
// insert each), not what the workload is about. On Redis a new key costs
// no more than a known one, and 100,000 round trips per library would take
// longer than the runs themselves. It passes copies of the keys: in a
// server every request's key is a new string, so a store that keeps the
// caller's string must compare the bytes of a later key with it, not find
// the same pointer (Go's map compares string pointers first).
func touch(b *testing.B, d peers.Decider) {
	for _, k := range spreadKeys {
		if _, err := d.Decide(context.Background(), strings.Clone(k)); err != nil {
			b.Fatalf("touching %q: %v", k, err)
		}
	}
}

// warm makes 64 concurrent decisions on a key of its own, so that a Redis
// client has its connections open before anything is timed.
func warm(b *testing.B, d peers.Decider) {
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := d.Decide(context.Background(), "warm"); err != nil {
					e := err
					failed.Store(&e)
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Logf("warm-up: %v", *err)
	}
}

// decide runs b.N decisions of w from g goroutines.
func decide(b *testing.B, d peers.Decider, w workload, g int) {
	ctx := context.Background()
	var allowed, errs atomic.Int64
	var firstErr atomic.Pointer[error]
	loop := func(next func() bool) {
		var ok, bad int64
		start := rand.IntN(spreadKeyCount)
		for i := 0; next(); i++ {
			a, err := d.Decide(ctx, w.key(start, i))
			switch {
			case err != nil:
				bad++
				e := err // a copy, so that err itself does not escape
				firstErr.CompareAndSwap(nil, &e)
			case a:
				ok++
			}
		}
		allowed.Add(ok)
		errs.Add(bad)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if g == 1 {
		n := 0
		loop(func() bool { n++; return n <= b.N })
	} else {
		// RunParallel starts parallelism × GOMAXPROCS goroutines.
		procs := runtime.GOMAXPROCS(0)
		b.SetParallelism((g + procs - 1) / procs)
		b.RunParallel(func(pb *testing.PB) { loop(pb.Next) })
	}
	elapsed := b.Elapsed()
	b.StopTimer()
	if n := errs.Load(); n == int64(b.N) && b.N >= 100 {
		b.Fatalf("every decision failed: %v", *firstErr.Load())
	}
	if elapsed > 0 {
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	}
	b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
	b.ReportMetric(float64(errs.Load())/float64(b.N), "errors/op")
}
