package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/bench/peers"
)

// peerModules are the peers' modules, for the versions line.
var peerModules = []string{
	"github.com/go-chi/httprate",
	"github.com/go-chi/httprate-redis",
	"github.com/ulule/limiter/v3",
	"github.com/go-redis/redis_rate/v10",
	"github.com/throttled/throttled/v2",
	"github.com/sethvargo/go-limiter",
	"golang.org/x/time",
	"github.com/redis/go-redis/v9",
}

// peerNotes are what the peers' code (at the versions in go.mod) does that
// matters for reading the tables. They were found reading that code and are
// visible in this run's numbers (allowed/op, errors/op, commands/request).
var peerNotes = []string{
	"**httprate** (+ httprate-redis): a sliding-window counter (no burst). `RateLimiter.OnLimit` holds one " +
		"process-wide mutex across the whole decision, including both Redis round trips (MGET of two windows, " +
		"then MULTI/INCRBY/EXPIRE/EXEC when allowed), so one process decides one request at a time on Redis. Check " +
		"and increment are two steps, not atomic across instances. `httprateredis.Config.Client` is a `*redis.Client`: " +
		"no Cluster or Ring client. Its only decision API writes `X-RateLimit-*` headers with `fmt.Sprintf`, which the " +
		"decision rows include. On a Redis error it falls back to an in-process counter unless `FallbackDisabled` " +
		"(set here, so errors are counted, not hidden).",
	"**ulule/limiter**: a fixed-window counter (no burst): every decision, denied or not, is an INCRBY in one " +
		"EVALSHA, so a flooding client keeps its window's counter growing; up to 2× the limit can pass around a " +
		"window boundary. Remaining and reset are reported.",
	"**go-redis/redis_rate**: GCRA in one Lua script (EVALSHA, EVAL on NOSCRIPT), like tollgate; floating-point " +
		"state. No HTTP middleware: the one here is the minimum (key, decision, 429 with Retry-After).",
	"**throttled**: has a go-redis v9 store (`store/goredisstore.v9`). GCRA done in Go: a pipelined TIME+GET, " +
		"then a compare-and-swap with EVAL (the whole script text on every call, never EVALSHA), or SETNX and a " +
		"separate EXPIRE for a new key: 2–3 round trips per allowed decision. Under contention on one key the CAS " +
		"fails and is retried; after 10 failures the decision is an error (`errors/op`), which its middleware " +
		"answers with 500. The memstore's CAS contends the same way in memory. Capacity is MaxBurst+1.",
	"**sethvargo/go-limiter**: in-process only (no Redis store in v0.7.1); `Tokens` per `Interval`, no separate " +
		"burst. At each new interval its refill sets the bucket to `elapsed intervals × Interval/Tokens` " +
		"(nanoseconds per token, used as a count of tokens) instead of `Tokens`, so above √(Interval in ns) tokens " +
		"per interval — 31,623 per second — a bucket never refills to its size. Checked with `Tokens: 100000, " +
		"Interval: time.Second`: 100,000 allowed in the first second, 10,000 in the next, 30,000 after 3 idle " +
		"seconds. The runs here are short (a new limiter per workload, about a second each) and never reach a " +
		"second interval, so they do not show it; a long-running server at 10⁷/s would allow 100 requests a second. " +
		"Reset is reported as a time; no Retry-After in seconds.",
	"**x/time/rate** in a map behind one mutex: the usual hand-rolled limiter; in-process only, never forgets a key.",
}

func (r *report) markdown() []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	p("# Benchmarks: tollgate and its peers\n\n")
	p("Written by `make bench-peers` (`bench/cmd/report`); do not edit by hand. Every library ran in the same run on ")
	p("the same machine, against the same redis-server (started by the report on a loopback port, `--save \"\" ")
	p("--appendonly no`), and every ratio is to tollgate **within this run**. The machine is a shared VM whose ")
	p("speed moves by 10–20 %% between runs: compare the rows of one table, not numbers across runs.\n\n")

	p("- **Machine:** %s, %d cores, %s, %s, %s\n", r.cpu, r.cores, r.goVersion, r.redisVersion,
		r.started.UTC().Format("2006-01-02 15:04 MST"))
	p("- **Load average** (from `/proc/loadavg`, other jobs on the machine count too): %s at the start, %s at the end\n",
		r.loadStart, r.loadEnd)
	p("- **Command:** `make bench-peers`, which runs `cd bench && go run ./cmd/report %s`\n", strings.Join(r.args, " "))
	p("- **Run time:** %s (%s)\n", r.elapsed.Round(time.Second), strings.Join(r.durations, ", "))
	p("- **Versions:** %s\n", r.versions())
	if len(r.failures) > 0 {
		p("\n**Parts that failed in this run:**\n\n")
		for _, f := range r.failures {
			p("- %s\n", oneLine(f))
		}
	}
	p("\n")

	p("| library | model |\n|---|---|\n")
	for _, lib := range []string{peers.Tollgate, peers.Httprate, peers.Ulule, peers.RedisRate, peers.Throttled, peers.Sethvargo, peers.XRate} {
		p("| %s | %s |\n", lib, peers.Describe(lib))
	}
	p("\n")

	if r.cfg.sections["decide"] {
		r.decideMarkdown(&b)
	}
	if r.cfg.sections["http"] {
		r.httpMarkdown(&b)
	}
	if r.cfg.sections["accuracy"] {
		r.accuracyMarkdown(&b)
	}
	if r.cfg.sections["ceiling"] {
		r.ceilingMarkdown(&b)
	}
	if r.cfg.sections["capacity"] {
		r.capacityMarkdown(&b)
	}

	p("## What the peers do\n\n")
	for _, n := range peerNotes {
		p("- %s\n", n)
	}
	p("\n")

	if r.benchstatOut != "" {
		p("## benchstat\n\n")
		p("Medians with 95 %% confidence intervals of section 1, from `go run %s -filter '%s' %s` in `bench/` "+
			"(the raw `go test` output is kept in `bench/%s`, ignored by git):\n\n", benchstat, benchstatFilter, decideOut, decideOut)
		p("<details><summary>benchstat output</summary>\n\n```\n%s```\n\n</details>\n", r.benchstatOut)
	}
	return b.Bytes()
}

func (r *report) versions() string {
	args := append([]string{"list", "-m", "-f", "{{.Path}} {{.Version}}"}, peerModules...)
	out, err := runCmd(context.Background(), r.cfg.goBin, args...)
	if err != nil {
		return "unknown (" + oneLine(err.Error()) + ")"
	}
	var v []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, ver, ok := strings.Cut(line, " "); ok {
			v = append(v, fmt.Sprintf("%s %s", strings.TrimPrefix(path, "github.com/"), ver))
		}
	}
	return strings.Join(v, ", ")
}

var workloadTitles = map[string]string{
	"hot":    "one hot key, mostly allowed",
	"spread": "100,000 keys, mostly allowed",
	"denied": "one key at 100/s, nearly all denied",
}

func (r *report) decideMarkdown(b *bytes.Buffer) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## 1. Decisions per second, store level\n\n")
	p("`go test -run '^$' -bench '^BenchmarkDecide$' -benchmem -count 1 -benchtime %s` in `bench/`, run %d times: "+
		"%d samples of each benchmark, taken in passes over all of them, so that a burst of load elsewhere on the "+
		"machine is spread over every library instead of landing on one "+
		"(names `BenchmarkDecide/<backend>/<library>/<workload>/g<goroutines>`). One op is one decision of cost 1 "+
		"through the library's lowest-level API (`Take`, `Allow`, `Get`, `RateLimitCtx`; httprate: `OnLimit`), "+
		"on `context.Background()`. Goroutines: 1 is a plain loop; 16 and 64 are `b.RunParallel` with "+
		"`b.SetParallelism(g / GOMAXPROCS)`. On Redis every library has its own go-redis client, `PoolSize: 64, "+
		"ContextTimeoutEnabled: true`, on the same redis-server.\n\n", r.cfg.benchtime, r.cfg.count, r.cfg.count)
	p("Limits: **hot and 100,000 keys: 10⁷ per second, burst 10⁸** (a bucket that refills in 10 s and that "+
		"nothing here can drain, so decisions are allowed: at 10⁶/s, burst 10⁶, the in-memory stores, which "+
		"decide several million times a second, would empty the hot bucket within the run and measure their "+
		"denial path instead); **denied: 100 per second, burst 100**. ulule and httprate, which have no burst, get the rate "+
		"per period; go-limiter gets `Tokens` = Burst every Burst/Rate periods (10⁸ per 10 s), the limit's capacity "+
		"and average rate, so that it too never drains the hot key. Before the in-memory 100,000-key runs, every key is decided once, untimed, "+
		"so that they measure decisions on known keys rather than making buckets, and from a copy of the key "+
		"strings: in a server each request's key is a new string, so a store that keeps the first caller's "+
		"string compares bytes with it instead of finding the same pointer. "+
		"Cells are the median decisions/s of %d samples, with the ratio to tollgate in the same column in "+
		"parentheses; allocations, the share of decisions allowed and the share that failed are at 64 "+
		"goroutines.\n\n", r.cfg.count)
	if len(r.decideRes) == 0 {
		p("_No results: see the failures above._\n\n")
		return
	}
	for _, backend := range []string{peers.Redis, peers.Memory} {
		libs := r.decideRes.libs(backend)
		if len(libs) == 0 {
			continue
		}
		for _, wl := range []string{"hot", "spread", "denied"} {
			p("### %s, %s\n\n", backendTitle(backend), workloadTitles[wl])
			p("| library | 1 goroutine | 16 goroutines | 64 goroutines | allocs/op | B/op | allowed | errors |\n")
			p("|---|--:|--:|--:|--:|--:|--:|--:|\n")
			for _, lib := range libs {
				p("| %s ", lib)
				for _, g := range []int{1, 16, 64} {
					v, ok := r.decideRes.median(decideName(backend, lib, wl, g), "decisions/s")
					base, bok := r.decideRes.median(decideName(backend, peers.Tollgate, wl, g), "decisions/s")
					switch {
					case !ok:
						p("| – ")
					case bok && base > 0:
						p("| %s (%.2f) ", fmtRate(v), v/base)
					default:
						p("| %s ", fmtRate(v))
					}
				}
				name := decideName(backend, lib, wl, 64)
				allocs, _ := r.decideRes.median(name, "allocs/op")
				bytesOp, _ := r.decideRes.median(name, "B/op")
				allowed, _ := r.decideRes.median(name, "allowed/op")
				errs, _ := r.decideRes.median(name, "errors/op")
				p("| %.0f | %.0f | %s | %s |\n", allocs, bytesOp, fmtShare(allowed), fmtShare(errs))
			}
			p("\n")
		}
	}
}

func (r *report) httpMarkdown(b *bytes.Buffer) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## 2. HTTP requests per second through each library's middleware\n\n")
	p("`bench/cmd/server` serves one library as middleware on a `net/http` server (handler: 200 \"ok\"); "+
		"`bench/cmd/load`, **another process**, keeps %d keep-alive connections busy (one request in flight on "+
		"each) for %s after %s of unmeasured warm-up, and counts statuses; this is done %d times per library, in "+
		"rounds over all of them, with a new server each time: req/s is over the rounds' summed time, p50 and "+
		"p99 are the means of the rounds'. Every library keys requests by the "+
		"same thing, the `X-Client` header, with its own middleware (tollgate `middleware.New` with default "+
		"headers, httprate `Limit`, ulule `stdlib.NewMiddleware`, throttled `HTTPRateLimiterCtx`, go-limiter "+
		"`httplimit`; a minimal one for redis_rate and x/time/rate, which ship none). "+
		"Server, load generator and redis-server share the %d cores, so absolute numbers are low and "+
		"the ratios are what to read. The go-redis client has `PoolSize: 64, ContextTimeoutEnabled: true` "+
		"(which tollgate's store requires; only tollgate sets a deadline, its default 100 ms budget). Per answered "+
		"request: the round trips and commands the server's go-redis client sent (counted by a client hook; a "+
		"pipeline is one round trip); the CPU time of Redis's main thread (`used_cpu_user_main_thread` + "+
		"`used_cpu_sys_main_thread` of `INFO cpu`, network included), which is what bounds the decisions per "+
		"second of a Redis core; and the commands Redis ran, from the `calls` of `INFO commandstats` before and "+
		"after the measured run — which include the commands a Lua script runs (tollgate's EVALSHA runs TIME, "+
		"GET and, when it takes tokens, SET, once per key of a call; on one node, concurrent decisions share one EVALSHA and its TIME). "+
		"\"bare handler\" is the handler with no middleware; tollgate-noheaders is tollgate with `WithHeaders(0)`; "+
		"\"bare handler + 5 fields\" is the handler behind no limiter after five constant fields of the shape of "+
		"tollgate's default headers are set (a map entry each, of a slice made once): what net/http itself spends "+
		"on them (the header map, its copy when the handler writes, sorting and writing them), a ceiling for any "+
		"middleware that sends them.\n\n", r.cfg.conns, r.cfg.httpDur, r.cfg.warmup, r.cfg.httpRounds, r.cores)
	for _, backend := range []string{peers.Redis, peers.Memory} {
		for _, w := range r.httpWorkloads() {
			rows := r.httpRowsFor(backend, w.name)
			if len(rows) == 0 {
				continue
			}
			p("### %s: %s\n\n", backendTitle(backend), w.title)
			p("| library | req/s | × tollgate | × bare | p50 | p99 | 200 | 429 | errors, other |")
			if backend == peers.Redis {
				p(" round trips | commands sent | Redis CPU | commands Redis ran |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
			} else {
				p("\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
			}
			var base, bare float64
			for _, row := range rows {
				if row.variant == peers.Tollgate && row.err == nil {
					base = row.combined().RPS
				}
				if row.variant == "bare handler" && row.err == nil {
					bare = row.combined().RPS
				}
			}
			for _, row := range rows {
				if row.err != nil {
					p("| %s | failed: %s |\n", row.variant, oneLine(row.err.Error()))
					continue
				}
				res := row.combined()
				ratio, ofBare := "–", "–"
				if base > 0 {
					ratio = fmt.Sprintf("%.2f", res.RPS/base)
				}
				if bare > 0 {
					ofBare = fmt.Sprintf("%.2f", res.RPS/bare)
				}
				other := res.Errors
				for s, n := range res.Status {
					if s != "200" && s != "429" {
						other += n
					}
				}
				p("| %s | %s | %s | %s | %s | %s | %d | %d | %d ", row.variant, fmtRate(res.RPS), ratio, ofBare,
					fmtMicros(res.P50us), fmtMicros(res.P99us), res.Status["200"], res.Status["429"], other)
				if backend == peers.Redis {
					if d := row.redis; d != nil && res.Requests > 0 {
						n := float64(res.Requests)
						p("| %.2f | %.2f | %.1f µs | %s ", float64(d.roundTrips)/n, float64(d.sent)/n,
							d.cpu*1e6/n, commandSummary(d.run, res.Requests))
					} else {
						p("| | | | ")
					}
				}
				p("|\n")
			}
			p("\n")
		}
	}
}

func (r *report) httpRowsFor(backend, workload string) []*httpRow {
	var rows []*httpRow
	for _, row := range r.httpRows {
		if row.backend == backend && row.workload == workload {
			rows = append(rows, row)
		}
	}
	return rows
}

func (r *report) accuracyMarkdown(b *bytes.Buffer) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	ideal := float64(accBurst) + accRate*r.cfg.accDur.Seconds()
	p("## 3. Accuracy: %d instances sharing one key\n\n", accInstances)
	p("`bench/cmd/accuracy`: %d independent limiters, each with its own go-redis client (as %d app servers), "+
		"decide for one shared key from %d goroutines in all, as fast as Redis answers, for %s, at **%d/s, "+
		"burst %d**. A token bucket allows at most %d + %d × %s = **%.0f**; the ratio is allowed ÷ %.0f. "+
		"The 1-instance column runs the same %d goroutines through a single limiter. Libraries without a "+
		"burst get %d per second (ulule: fixed 1 s windows from the key's first hit; httprate: a sliding "+
		"window over aligned 1 s windows), so about %.0f is their own ceiling here.\n\n",
		accInstances, accInstances, accGoroutines, r.cfg.accDur, accRate, accBurst, accBurst, accRate,
		r.cfg.accDur, ideal, ideal, accGoroutines, accRate, accRate*r.cfg.accDur.Seconds())
	if len(r.accRows) == 0 {
		p("_No results: see the failures above._\n\n")
		return
	}
	p("| library | allowed, %d instances | ÷ %.0f | decisions | errors | allowed, 1 instance | ÷ %.0f |\n", accInstances, ideal, ideal)
	p("|---|--:|--:|--:|--:|--:|--:|\n")
	var names []string
	for _, a := range r.accRows {
		if !contains(names, a.Lib) {
			names = append(names, a.Lib)
		}
	}
	for _, name := range names {
		var multi, single *accResult
		for i := range r.accRows {
			a := &r.accRows[i]
			if a.Lib != name {
				continue
			}
			if a.Instances == 1 {
				single = a
			} else {
				multi = a
			}
		}
		p("| %s ", name)
		if multi != nil {
			p("| %d | %.3f | %d | %d ", multi.Allowed, float64(multi.Allowed)/ideal, multi.Decisions, multi.Errors)
		} else {
			p("| – | – | – | – ")
		}
		if single != nil {
			p("| %d | %.3f |\n", single.Allowed, float64(single.Allowed)/ideal)
		} else {
			p("| – | – |\n")
		}
	}
	p("\n")
}

func (r *report) ceilingMarkdown(b *bytes.Buffer) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## 4. The ceiling: redis-benchmark running tollgate's script\n\n")
	p("`lua.TokenBucket` loaded with `SCRIPT LOAD`, then run by `redis-benchmark` (in C, no Go client " +
		"between) with the arguments `store.Redis` sends for a Take of cost 1 (`lua/tokenbucket.lua` with " +
		"one key, a group of one: `EVALSHA <sha> 1 <key> 1 <k> <cap> <q>`; for a limit of R tokens per P µs, burst B, and " +
		"g = gcd(R, P): q = R/g, a token is t = P/g units of 1/q µs, cap = B·t and k = t; the commands " +
		"below): what this machine's redis-server can decide at most, one command per round " +
		"trip (`-P 1`) or 16 (`-P 16`). The last columns set tollgate's `store.Redis` from section 1 against it, " +
		"same workload and concurrency: without batching against `-P 1`, with its default batching against " +
		"`-P 16`. redis-benchmark ran after section 1, not beside it, so the share moves with the machine's " +
		"load between the two. \"EVALSHA in Redis\" is the script's own time (`usec` over `calls` of " +
		"`cmdstat_evalsha`); \"Redis CPU\" is the main thread's CPU time over the same calls, network " +
		"included: one Redis core cannot run the script faster than once per that many microseconds. " +
		"Without batching every Take is one script call, so the store cannot decide more often than Redis " +
		"runs the script; with it, on one node, concurrent Takes share one call (and its TIME), so it can pass that.\n\n")
	p("| run | decisions/s | p50 | p99 | EVALSHA in Redis | Redis CPU per EVALSHA | tollgate store.Redis | decisions/s | share of ceiling |\n")
	p("|---|--:|--:|--:|--:|--:|---|--:|--:|\n")
	for _, row := range r.ceilRows {
		if row.err != nil {
			p("| %s | failed: %s | | | | | | | |\n", row.run.title, oneLine(row.err.Error()))
			continue
		}
		p("| %s | %s | %s | %s | %.1f µs | %.1f µs ", row.run.title, fmtRate(row.rps), fmtMillis(row.p50),
			fmtMillis(row.p99), row.scriptUs, row.cpuUs)
		variant, g := r.ceilingPeer(row.run)
		if v, ok := r.decideRes.median(decideName(peers.Redis, variant, row.run.workload, g), "decisions/s"); ok && variant != "" {
			p("| %s, %s | %s | %.2f |\n", variant, goroutinesText(g), fmtRate(v), v/row.rps)
			continue
		}
		p("| | | |\n")
	}
	p("\nCommands:\n\n```\n")
	for _, row := range r.ceilRows {
		p("%s\n", row.cmdline)
	}
	p("```\n\n")
}

// ceilingPeer returns the tollgate variant and goroutine count of section 1
// that compare with run: the same concurrency, and batching only against a
// pipelined run.
func (r *report) ceilingPeer(run ceilRun) (variant string, goroutines int) {
	goroutines = 64
	if run.conns == 1 {
		goroutines = 1
	}
	switch {
	case run.pipeline > 1:
		return peers.Tollgate, goroutines // batching is the store's default
	case contains(r.decideRes.libs(peers.Redis), "tollgate-batch0"):
		return "tollgate-batch0", goroutines
	}
	return "", 0
}

func backendTitle(backend string) string {
	if backend == peers.Redis {
		return "Redis"
	}
	return "In memory"
}

// fmtRate formats a count per second with about three significant digits.
func fmtRate(v float64) string {
	unit := ""
	switch {
	case v >= 1e6:
		v, unit = v/1e6, "M"
	case v >= 1e3:
		v, unit = v/1e3, "k"
	default:
		return fmt.Sprintf("%.0f", v)
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, unit)
	}
	return fmt.Sprintf("%.2f%s", v, unit)
}

// fmtShare formats a fraction in [0, 1] as a percentage.
func fmtShare(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 0.01:
		return fmt.Sprintf("%.2g %%", v*100)
	case v >= 0.995 && v < 1:
		// Not "100 %" for what is not all.
		return fmt.Sprintf("%.1f %%", math.Floor(v*1000)/10)
	}
	return fmt.Sprintf("%.0f %%", v*100)
}

// thousands formats n with comma separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func fmtMicros(us float64) string {
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}

func fmtMillis(ms float64) string { return fmtMicros(ms * 1000) }

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func goroutinesText(g int) string {
	if g == 1 {
		return "1 goroutine"
	}
	return fmt.Sprintf("%d goroutines", g)
}

func (r *report) capacityMarkdown(b *bytes.Buffer) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## 5. Capacity: what a decision costs Redis\n\n")
	p("What decides how many Redis cores (Cluster masters) a limit needs is Redis's CPU per decision, which "+
		"every app server shares. Each row is 30,000 decisions from 64 goroutines on one client (`PoolSize: 64`) "+
		"against the report's redis-server, emptied before each, run %d times in rounds over every row; the run of median CPU is shown: \"Redis CPU\" is the main thread's CPU time "+
		"(`used_cpu_user_main_thread` + `used_cpu_sys_main_thread` of `INFO cpu`, network included) over the "+
		"decisions; \"in commands\" the time Redis counted inside them (`usec` of `INFO commandstats`); "+
		"\"commands\" what it ran per decision, a script's own included. Decisions per core are 10⁶ over the "+
		"CPU; masters for 10⁶ decisions/s assume Cluster spreads the keys evenly and each master gives 80 %% of "+
		"its core to them. tollgate batches by default (on one node, concurrent Takes share one script call: one "+
		"EVALSHA, one TIME, fewer reads and writes of the socket per decision); `tollgate-batch0` is the same store without. \"2 policies\" is "+
		"one `TakeAll` of two buckets of one subject: one script call.\n\n", r.cfg.capRounds)
	p("| library | workload | Redis CPU / decision | in commands | commands | decisions/s per Redis core | masters for 10⁶/s | failed |\n")
	p("|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, row := range r.capRows {
		if row.err != nil {
			p("| %s | %s | failed: %s | | | | | |\n", row.lib, row.workload, oneLine(row.err.Error()))
			continue
		}
		p("| %s | %s | %.1f µs | %.1f µs | %.1f | %s | %d | %s |\n", row.lib, row.workload, row.cpuUs, row.scriptUs,
			row.commands, fmtRate(1e6/row.cpuUs), masters(row.cpuUs), fmtShare(row.failed))
	}
	p("\nMemory of an active bucket: `used_memory` of `INFO memory` before and after one decision on each of " +
		"10,000 new keys under 100 per hour (so that every key lives through the measurement), over 10,000: " +
		"the key, its value and its entries in Redis's key and expiry dictionaries. Every library's keys are " +
		fmt.Sprint(memKeyLen) + " bytes long in Redis (the caller's key zero-padded after the library's prefix): " +
		"a key's name is the user's choice, not what the library costs. MEMORY USAGE counts a value's object " +
		"even where Redis shares it (a small integer, as a counter's), which used_memory does not.\n\n")
	p("| library | bytes per active key | MEMORY USAGE of one |\n|---|--:|--:|\n")
	for _, m := range r.capMems {
		if m.err != nil {
			p("| %s | failed: %s |\n", m.lib, oneLine(m.err.Error()))
			continue
		}
		p("| %s | %.0f | %d |\n", m.lib, m.bytesPerKy, m.usage)
	}
	p("\n")
}
