package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/lua"
	"github.com/tollgate-go/tollgate/store"
)

// ceilRun is one redis-benchmark run of tollgate's script.
type ceilRun struct {
	title    string
	workload string // the BenchmarkDecide workload it bounds
	conns    int
	pipeline int
	n        int
	random   bool // -r 100000 and a __rand_int__ key
	limit    store.Limit
}

type ceilRow struct {
	run      ceilRun
	cmdline  string
	rps      float64
	p50, p99 float64 // ms
	// scriptUs is the time Redis spent in one EVALSHA, from INFO
	// commandstats; cpuUs is its main thread's CPU time per EVALSHA, from
	// INFO cpu (network included).
	scriptUs, cpuUs float64
	err             error
}

func (r *report) ceilRuns() []ceilRun {
	n := r.cfg.ceilN
	// The limits of BenchmarkDecide's workloads (decide_test.go), so that
	// each row bounds the same decisions: 10^7/s, burst 10^8 (nothing here
	// drains it), and 100/s, burst 100.
	generous := store.Limit{Rate: 10_000_000, Period: time.Second, Burst: 100_000_000}
	denied := store.Limit{Rate: 100, Period: time.Second, Burst: 100}
	return []ceilRun{
		{"hot key, 1 connection", "hot", 1, 1, max(n/5, 1), false, generous},
		{"hot key, 64 connections", "hot", 64, 1, n, false, generous},
		{"hot key, 64 connections, -P 16", "hot", 64, 16, 2 * n, false, generous},
		{"100,000 keys, 64 connections", "spread", 64, 1, n, true, generous},
		{"100,000 keys, 64 connections, -P 16", "spread", 64, 16, 2 * n, true, generous},
		{"denied key (100/s), 64 connections", "denied", 64, 1, n, false, denied},
		{"denied key (100/s), 64 connections, -P 16", "denied", 64, 16, 2 * n, false, denied},
	}
}

// ceiling loads tollgate's script with SCRIPT LOAD and runs it with
// redis-benchmark.
func (r *report) ceiling(ctx context.Context) error {
	if err := r.flushRedis(ctx); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: r.redis.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	sha, err := c.ScriptLoad(ctx, lua.TokenBucket).Result()
	if err != nil {
		return fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	if sha != lua.TokenBucketSHA1 {
		return fmt.Errorf("SCRIPT LOAD returned %s, want lua.TokenBucketSHA1 %s", sha, lua.TokenBucketSHA1)
	}
	host, port, _ := strings.Cut(r.redis.Addr, ":")
	for _, run := range r.ceilRuns() {
		key := "bench:hot"
		switch {
		case run.random:
			key = "bench:__rand_int__"
		case run.workload == "denied":
			key = "bench:denied"
		}
		args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(run.conns), "-n", strconv.Itoa(run.n),
			"-P", strconv.Itoa(run.pipeline)}
		if run.random {
			args = append(args, "-r", "100000")
		}
		argv, err := scriptArgs(ctx, r.redis.Addr, run.limit)
		if err != nil {
			return err
		}
		args = append(args, "--csv", "EVALSHA", sha, "1", key)
		args = append(args, argv...)
		row := ceilRow{run: run, cmdline: "redis-benchmark " + strings.Join(args, " ")}
		before, err := r.stats(ctx)
		if err != nil {
			return err
		}
		out, err := runCmd(ctx, "redis-benchmark", args...)
		if err == nil {
			row.rps, row.p50, row.p99, err = parseBenchmarkCSV(out)
		}
		if err == nil {
			after, serr := r.stats(ctx)
			if serr != nil {
				return serr
			}
			if calls := after.calls["evalsha"] - before.calls["evalsha"]; calls > 0 {
				row.scriptUs = float64(after.usec["evalsha"]-before.usec["evalsha"]) / float64(calls)
				row.cpuUs = (after.cpu - before.cpu) * 1e6 / float64(calls)
			}
		}
		row.err = err
		if err != nil {
			logf("ceiling %s: %v", run.title, err)
		} else {
			logf("ceiling %s: %.0f/s, p50 %.3fms", run.title, row.rps, row.p50)
		}
		r.ceilRows = append(r.ceilRows, row)
	}
	return nil
}

// scriptArgs returns the ARGV that store.Redis gives the script for a Take
// of cost 1 under l, as it sends them: a go-redis hook records one Take on a
// scratch key (deleted afterwards), so that the ceiling runs exactly the
// store's call. That call is lua/tokenbucket.lua with one key in a group of
// one, EVALSHA <sha> 1 <key> 1 <k> <cap> <q>: for l = R tokens per P µs, burst B,
// and g = gcd(R, P), q = R/g, t = P/g, cap = B*t and k = t (a cost of 1).
func scriptArgs(ctx context.Context, addr string, l store.Limit) ([]string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	var argv []string
	var numkeys string
	c.AddHook(argsHook(func(cmd redis.Cmder) {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			args := cmd.Args() // EVALSHA sha numkeys key... ARGV...
			numkeys, argv = fmt.Sprint(args[2]), argv[:0]
			for _, a := range args[4:] {
				argv = append(argv, fmt.Sprint(a))
			}
		}
	}))
	s := store.NewRedis(c, store.WithKeyPrefix("ceiling-args:"), store.WithBatching(0))
	if _, err := s.Take(ctx, "scratch", l, 1); err != nil {
		return nil, fmt.Errorf("ceiling: a Take to learn the script's arguments: %w", err)
	}
	if err := c.Del(ctx, s.Key("scratch")).Err(); err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("ceiling: the store's Take sent no script call")
	}
	if numkeys != "1" || len(argv) != 4 || argv[0] != "1" {
		return nil, fmt.Errorf("ceiling: the store's Take sent %s keys and arguments %q; want 1 key and 1 <k> <cap> <q>", numkeys, argv)
	}
	return argv, nil
}

// argsHook calls f with every command a client sends on its own.
type argsHook func(redis.Cmder)

func (h argsHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h(cmd)
		return next(ctx, cmd)
	}
}
func (h argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// parseBenchmarkCSV reads redis-benchmark --csv: a header line, then
// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
// "p95_latency_ms","p99_latency_ms","max_latency_ms".
func parseBenchmarkCSV(out []byte) (rps, p50, p99 float64, err error) {
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("redis-benchmark output %q: %w", out, err)
	}
	if len(recs) < 2 {
		return 0, 0, 0, fmt.Errorf("redis-benchmark printed no result: %q", out)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	row := recs[len(recs)-1]
	get := func(name string) (float64, error) {
		i, ok := col[name]
		if !ok || i >= len(row) {
			return 0, fmt.Errorf("redis-benchmark output has no %s column: %q", name, out)
		}
		return strconv.ParseFloat(row[i], 64)
	}
	if rps, err = get("rps"); err != nil {
		return
	}
	if p50, err = get("p50_latency_ms"); err != nil {
		return
	}
	p99, err = get("p99_latency_ms")
	return
}
