package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/bench/internal/proc"
	"github.com/tollgate-go/tollgate/bench/peers"
	"github.com/tollgate-go/tollgate/store"
)

// capRow is what one library's decisions cost Redis, for capacity planning.
type capRow struct {
	lib, workload string
	decisions     int64
	cpuUs         float64 // Redis main-thread CPU per decision, network included
	scriptUs      float64 // time inside the commands (INFO commandstats usec) per decision
	commands      float64 // commands Redis ran per decision (a script's own included)
	failed        float64 // share of the decisions that failed (throttled's compare-and-swap gives up)
	err           error
}

// capMem is the Redis memory one library's active bucket holds.
type capMem struct {
	lib        string
	bytesPerKy float64 // used_memory growth per key, the key's dictionary and expiry entries included
	usage      int64   // MEMORY USAGE of one of the keys
	err        error
}

// capacity measures Redis's CPU per decision of each Redis library, from 64
// goroutines, over a fixed count of decisions (INFO cpu before and after),
// and the memory of an active bucket (INFO memory over 10,000 keys).
func (r *report) capacity(ctx context.Context) error {
	const n = 30_000
	generous := store.Limit{Rate: 10_000_000, Period: time.Second, Burst: 100_000_000}
	tight := store.PerSecond(100)
	workloads := []struct {
		name  string
		limit store.Limit
		key   func(i int) string
	}{
		{"hot", generous, func(int) string { return "hot" }},
		{"spread", generous, func(i int) string { return "k:" + strconv.Itoa(i*7919%100_000) }},
		{"denied", tight, func(int) string { return "denied" }},
	}
	zero := 0
	libs := []struct {
		name     string
		lib      string
		batching *int
	}{{"tollgate", peers.Tollgate, nil}, {"tollgate-batch0", peers.Tollgate, &zero},
		{peers.RedisRate, peers.RedisRate, nil}, {peers.Ulule, peers.Ulule, nil}, {peers.Throttled, peers.Throttled, nil}}
	type capRun struct {
		lib, workload string
		mk            func(*redis.Client) (func(context.Context, int) error, func() error, error)
	}
	var runs []capRun
	for _, lib := range libs {
		for _, w := range workloads {
			runs = append(runs, capRun{lib.name, w.name, func(c *redis.Client) (func(context.Context, int) error, func() error, error) {
				d, err := peers.NewDecider(peers.Config{Lib: lib.lib, Backend: peers.Redis, Client: c, Limit: w.limit, Batching: lib.batching})
				if err != nil {
					return nil, nil, err
				}
				return func(ctx context.Context, i int) error { _, err := d.Decide(ctx, w.key(i)); return err }, d.Close, nil
			}})
		}
	}
	// tollgate with two policies on one subject: one script call, two buckets.
	for _, w := range workloads {
		runs = append(runs, capRun{"tollgate, 2 policies", w.name, func(c *redis.Client) (func(context.Context, int) error, func() error, error) {
			s := store.NewRedis(c)
			return func(ctx context.Context, i int) error {
				k := w.key(i)
				_, err := s.TakeAll(ctx, []store.Request{{Key: "a:{" + k + "}", Limit: w.limit, Cost: 1}, {Key: "b:{" + k + "}", Limit: w.limit, Cost: 1}})
				return err
			}, func() error { return nil }, nil
		}})
	}
	// In rounds over every row, as the other sections, so that a burst of load
	// elsewhere on the machine does not land on one library only; each row is
	// its round of median CPU.
	samples := make([][]capRow, len(runs))
	for round := 1; round <= r.cfg.capRounds; round++ {
		logf("capacity round %d of %d", round, r.cfg.capRounds)
		for i, run := range runs {
			row := capRow{lib: run.lib, workload: run.workload}
			row.decisions, row.cpuUs, row.scriptUs, row.commands, row.failed, row.err = r.capacityRun(ctx, n, run.mk)
			logf("capacity %s/%s: %.2f µs of Redis CPU per decision (%v)", row.lib, row.workload, row.cpuUs, row.err)
			samples[i] = append(samples[i], row)
		}
	}
	for _, rows := range samples {
		slices.SortStableFunc(rows, func(a, b capRow) int {
			return cmp.Or(cmp.Compare(errRank(a.err), errRank(b.err)), cmp.Compare(a.cpuUs, b.cpuUs))
		})
		ok := len(rows)
		for ok > 0 && rows[ok-1].err != nil {
			ok--
		}
		if ok == 0 {
			r.capRows = append(r.capRows, rows[0])
		} else {
			r.capRows = append(r.capRows, rows[(ok-1)/2])
		}
	}
	slow := store.PerHour(100) // buckets that stay active for the whole measurement
	for _, lib := range libs[:1:1] {
		r.capMems = append(r.capMems, r.capacityMemory(ctx, lib.name, lib.lib, slow))
	}
	for _, lib := range libs[2:] {
		r.capMems = append(r.capMems, r.capacityMemory(ctx, lib.name, lib.lib, slow))
	}
	return nil
}

func errRank(err error) int {
	if err != nil {
		return 1
	}
	return 0
}

// capacityRun makes n decisions from 64 goroutines with the decide function
// that mk builds on a fresh client, and returns Redis's CPU, command time and
// commands per decision, and the share of decisions that failed.
func (r *report) capacityRun(ctx context.Context, n int, mk func(*redis.Client) (func(context.Context, int) error, func() error, error)) (_ int64, cpuUs, scriptUs, commands, failedShare float64, _ error) {
	if err := r.flushRedis(ctx); err != nil {
		return 0, 0, 0, 0, 0, err
	}
	c := redis.NewClient(&redis.Options{Addr: r.redis.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	defer c.Close()
	decide, closeFn, err := mk(c)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer closeFn()
	for i := range 64 { // connections open, script loaded
		if err := decide(ctx, 1_000_000+i); err != nil && i == 0 {
			return 0, 0, 0, 0, 0, err
		}
	}
	before, err := r.stats(ctx)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)); i <= n; i = int(next.Add(1)) {
				if decide(ctx, i) != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	after, err := r.stats(ctx)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	if f := failed.Load(); f == int64(n) {
		return 0, 0, 0, 0, 0, fmt.Errorf("all %d decisions failed", n)
	}
	var calls, usec int64
	for cmd, v := range after.calls {
		if cmd != "hello" && cmd != "client" { // a connection's handshake, the stats' own
			calls += v - before.calls[cmd]
			usec += after.usec[cmd] - before.usec[cmd]
		}
	}
	return int64(n), (after.cpu - before.cpu) * 1e6 / float64(n), float64(usec) / float64(n), float64(calls) / float64(n),
		float64(failed.Load()) / float64(n), nil
}

// memKeyLen is the length of every Redis key in capacityMemory.
const memKeyLen = 32

// capacityMemory decides once on each of 10,000 keys under limit, each
// memKeyLen bytes long in Redis, and returns Redis's used_memory growth per key.
func (r *report) capacityMemory(ctx context.Context, name, lib string, limit store.Limit) capMem {
	const keys = 10_000
	m := capMem{lib: name}
	if m.err = r.flushRedis(ctx); m.err != nil {
		return m
	}
	c := redis.NewClient(&redis.Options{Addr: r.redis.Addr, PoolSize: 16, ContextTimeoutEnabled: true})
	defer c.Close()
	d, err := peers.NewDecider(peers.Config{Lib: lib, Backend: peers.Redis, Client: c, Limit: limit})
	if err != nil {
		m.err = err
		return m
	}
	defer d.Close()
	if _, m.err = d.Decide(ctx, "warm"); m.err != nil {
		return m
	}
	// Every library's Redis keys padded to one length: the name is the
	// user's choice (a prefix option), not what the library costs.
	found, err := c.Keys(ctx, "*warm").Result()
	if err == nil && len(found) != 1 {
		err = fmt.Errorf("found %q for the key warm; want one Redis key", found)
	}
	if err != nil {
		m.err = err
		return m
	}
	width := memKeyLen - (len(found[0]) - len("warm")) - len("mem:")
	used := func() (float64, error) {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		return strconv.ParseFloat(proc.InfoField(info, "used_memory"), 64)
	}
	before, err := used()
	if err != nil {
		m.err = err
		return m
	}
	for i := range keys {
		if _, m.err = d.Decide(ctx, fmt.Sprintf("mem:%0*d", width, i)); m.err != nil {
			return m
		}
	}
	after, err := used()
	if err != nil {
		m.err = err
		return m
	}
	m.bytesPerKy = (after - before) / keys
	one := strings.Replace(found[0], "warm", fmt.Sprintf("mem:%0*d", width, keys-1), 1)
	if m.usage, m.err = c.MemoryUsage(ctx, one).Result(); m.err != nil {
		m.err = fmt.Errorf("MEMORY USAGE %s: %w", one, m.err)
		return m
	}
	logf("capacity memory %s: %.0f bytes per active key, MEMORY USAGE %d", name, m.bytesPerKy, m.usage)
	return m
}

// masters returns how many Redis Cluster masters 1,000,000 decisions/s
// need at cpuUs of main-thread CPU each (cpuUs cores in all), if each
// master spends 80 % of its core on them.
func masters(cpuUs float64) int { return int(math.Ceil(cpuUs / 0.8)) }
