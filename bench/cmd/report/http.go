package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/bench/internal/proc"
	"github.com/tollgate-go/tollgate/bench/peers"
)

// httpWorkload is one load shape.
type httpWorkload struct {
	name  string
	title string
	keys  int // distinct X-Client values
	// server flags for the limit
	limit, burst string
}

func (r *report) httpWorkloads() []httpWorkload {
	return []httpWorkload{
		{"spread", fmt.Sprintf("%s clients, all allowed (limit 10⁷/s, burst 10⁸ per client)", thousands(r.cfg.httpKeys)),
			r.cfg.httpKeys, "10000000", "100000000"},
		{"denied", "one client flooding at 100/s, burst 100 (nearly all 429)", 1, "100", "100"},
	}
}

// httpVariant is a library with its tollgate options.
type httpVariant struct {
	name  string
	lib   string
	flags []string
}

func (r *report) httpVariants(backend string) []httpVariant {
	vs := []httpVariant{{name: "bare handler", lib: "bare"}} // no middleware: the ceiling
	for _, lib := range peers.Libs(backend) {
		vs = append(vs, httpVariant{name: lib, lib: lib})
		if lib != peers.Tollgate {
			continue
		}
		if backend == peers.Redis {
			vs = append(vs, httpVariant{name: "tollgate-batch0", lib: lib, flags: []string{"-batching", "0"}})
		}
		vs = append(vs, httpVariant{name: "tollgate-denycache", lib: lib,
			flags: []string{"-deny-cache", strconv.Itoa(r.cfg.denyCache)}})
		if backend == peers.Memory {
			vs = append(vs, httpVariant{name: "tollgate-noheaders", lib: lib, flags: []string{"-no-headers"}},
				httpVariant{name: "bare handler + 5 fields", lib: "bare-fields"})
		}
	}
	return vs
}

// loadResult is cmd/load's JSON.
type loadResult struct {
	Seconds    float64          `json:"seconds"`
	Requests   int64            `json:"requests"`
	RPS        float64          `json:"rps"`
	P50us      float64          `json:"p50_us"`
	P99us      float64          `json:"p99_us"`
	Status     map[string]int64 `json:"status"`
	Errors     int64            `json:"errors"`
	FirstError string           `json:"first_error"`
}

// httpRow is one library under one workload, over every round.
type httpRow struct {
	backend, workload, variant string
	rounds                     []loadResult
	redis                      *redisDelta // the rounds' sum; nil in memory
	err                        error
}

// redisDelta is the Redis traffic of a measured run.
type redisDelta struct {
	// sent and roundTrips are what the server's go-redis client sent.
	sent, roundTrips int64
	// run is what INFO commandstats counted, by command: the commands
	// sent and those that scripts ran.
	run map[string]int64
	// cpu is the CPU time of Redis's main thread, in seconds.
	cpu float64
}

func (d *redisDelta) add(e *redisDelta) {
	d.sent += e.sent
	d.roundTrips += e.roundTrips
	d.cpu += e.cpu
	for k, v := range e.run {
		d.run[k] += v
	}
}

// combined sums the rounds: requests and statuses add up, req/s is over
// the summed time, and p50 and p99 are the means of the rounds'.
func (row *httpRow) combined() loadResult {
	c := loadResult{Status: map[string]int64{}}
	for _, r := range row.rounds {
		c.Seconds += r.Seconds
		c.Requests += r.Requests
		c.Errors += r.Errors
		c.P50us += r.P50us / float64(len(row.rounds))
		c.P99us += r.P99us / float64(len(row.rounds))
		for s, n := range r.Status {
			c.Status[s] += n
		}
	}
	if c.Seconds > 0 {
		c.RPS = float64(c.Requests) / c.Seconds
	}
	return c
}

// clientCounts is cmd/server's GET /debug/redis.
type clientCounts struct {
	Commands   int64 `json:"commands"`
	RoundTrips int64 `json:"round_trips"`
}

// http runs every library as middleware in cmd/server and loads it with
// cmd/load, in rounds over all of them, so that a burst of load elsewhere
// on the machine does not land on one library only.
func (r *report) http(ctx context.Context) error {
	rows := map[string]*httpRow{}
	for round := 1; round <= r.cfg.httpRounds; round++ {
		logf("http round %d of %d", round, r.cfg.httpRounds)
		for _, backend := range []string{peers.Redis, peers.Memory} {
			for _, w := range r.httpWorkloads() {
				for _, v := range r.httpVariants(backend) {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					id := backend + "/" + w.name + "/" + v.name
					row := rows[id]
					if row == nil {
						row = &httpRow{backend: backend, workload: w.name, variant: v.name}
						rows[id] = row
						r.httpRows = append(r.httpRows, row)
					}
					if row.err != nil {
						continue
					}
					res, delta, err := r.httpRun(ctx, backend, w, v)
					if err != nil {
						row.err = err
						logf("http %s: %v", id, err)
						continue
					}
					logf("http %s: %.0f req/s, p50 %.0fµs, p99 %.0fµs, %v", id, res.RPS, res.P50us, res.P99us, res.Status)
					row.rounds = append(row.rounds, res)
					if delta != nil {
						if row.redis == nil {
							row.redis = &redisDelta{run: map[string]int64{}}
						}
						row.redis.add(delta)
					}
				}
			}
		}
	}
	return nil
}

func (r *report) httpRun(ctx context.Context, backend string, w httpWorkload, v httpVariant) (loadResult, *redisDelta, error) {
	if backend == peers.Redis {
		if err := r.flushRedis(ctx); err != nil {
			return loadResult{}, nil, err
		}
	}
	lifetime := r.cfg.warmup + r.cfg.httpDur + time.Minute
	args := []string{"-lib", v.lib, "-store", backend, "-redis", r.redis.Addr,
		"-limit", w.limit, "-burst", w.burst, "-exit-on-eof", "-max-lifetime", lifetime.String()}
	args = append(args, v.flags...)
	srv, addr, err := startServer(r.bin("server"), args)
	if err != nil {
		return loadResult{}, nil, err
	}
	defer srv.stop()

	load := func(d time.Duration) (loadResult, error) {
		out, err := runCmd(ctx, r.bin("load"), "-url", "http://"+addr+"/", "-c", strconv.Itoa(r.cfg.conns),
			"-d", d.String(), "-keys", strconv.Itoa(w.keys), "-json")
		if err != nil {
			return loadResult{}, err
		}
		var res loadResult
		if err := json.Unmarshal(out, &res); err != nil {
			return loadResult{}, fmt.Errorf("load printed %q: %w", out, err)
		}
		return res, nil
	}
	if r.cfg.warmup > 0 {
		if _, err := load(r.cfg.warmup); err != nil {
			return loadResult{}, nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	var before redisStats
	var sentBefore clientCounts
	if backend == peers.Redis {
		if before, err = r.stats(ctx); err != nil {
			return loadResult{}, nil, err
		}
		if sentBefore, err = fetchCounts(ctx, addr); err != nil {
			return loadResult{}, nil, err
		}
	}
	res, err := load(r.cfg.httpDur)
	if err != nil {
		return loadResult{}, nil, err
	}
	if srv.p.Exited() {
		return res, nil, fmt.Errorf("server exited during the run")
	}
	if backend != peers.Redis {
		return res, nil, nil
	}
	after, err := r.stats(ctx)
	if err != nil {
		return loadResult{}, nil, err
	}
	sentAfter, err := fetchCounts(ctx, addr)
	if err != nil {
		return loadResult{}, nil, err
	}
	d := &redisDelta{
		sent:       sentAfter.Commands - sentBefore.Commands,
		roundTrips: sentAfter.RoundTrips - sentBefore.RoundTrips,
		cpu:        after.cpu - before.cpu,
		run:        map[string]int64{},
	}
	for cmd, calls := range after.calls {
		if n := calls - before.calls[cmd]; n > 0 {
			d.run[cmd] = n
		}
	}
	return res, d, nil
}

// fetchCounts reads cmd/server's count of Redis commands sent.
func fetchCounts(ctx context.Context, addr string) (clientCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/redis", nil)
	if err != nil {
		return clientCounts{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return clientCounts{}, fmt.Errorf("server's /debug/redis: %w", err)
	}
	defer resp.Body.Close()
	var c clientCounts
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return clientCounts{}, fmt.Errorf("server's /debug/redis: %w", err)
	}
	return c, nil
}

// redisStats is what INFO says about the commands Redis ran.
type redisStats struct {
	calls map[string]int64 // by command, except INFO itself
	usec  map[string]int64 // microseconds spent, by command
	cpu   float64          // seconds of CPU of the main thread, user + system
}

// stats reads INFO commandstats and INFO cpu.
func (r *report) stats(ctx context.Context) (redisStats, error) {
	c := redis.NewClient(&redis.Options{Addr: r.redis.Addr, PoolSize: 1})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return redisStats{}, fmt.Errorf("INFO commandstats cpu: %w", err)
	}
	st := redisStats{calls: map[string]int64{}, usec: map[string]int64{}}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_sys_main_thread", "used_cpu_user_main_thread":
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				return redisStats{}, fmt.Errorf("INFO cpu: %q: %w", line, err)
			}
			st.cpu += v
			continue
		}
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !isCmd || name == "info" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return redisStats{}, fmt.Errorf("INFO commandstats: %q: %w", line, err)
			}
			if k == "calls" {
				st.calls[name] = n
			} else {
				st.usec[name] = n
			}
		}
	}
	return st, nil
}

// server is a running cmd/server.
type server struct {
	p     *proc.Process
	stdin io.WriteCloser
}

// startServer starts cmd/server and waits for its "listening on" line.
func startServer(bin string, args []string) (*server, string, error) {
	cmd := exec.Command(bin, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = os.Stderr
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, "", fmt.Errorf("starting server: %w", err)
	}
	s := &server{p: p, stdin: stdin}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				select {
				case addrc <- a:
				default:
				}
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case a := <-addrc:
		return s, a, nil
	case <-p.Done():
		return nil, "", fmt.Errorf("server %s exited before listening", strings.Join(args, " "))
	case <-time.After(10 * time.Second):
		s.stop()
		return nil, "", fmt.Errorf("server %s did not listen within 10s", strings.Join(args, " "))
	}
}

// stop closes the server's standard input (it exits on EOF), then signals
// it by PID if it has not exited.
func (s *server) stop() {
	s.stdin.Close()
	select {
	case <-s.p.Done():
		return
	case <-time.After(3 * time.Second):
	}
	if err := s.p.Stop(2 * time.Second); err != nil {
		logf("%v", err)
	}
}

// commandSummary formats the commands of m per request, largest first.
func commandSummary(counts map[string]int64, requests int64) string {
	if requests == 0 {
		return ""
	}
	m := map[string]float64{}
	for k, n := range counts {
		m[k] = float64(n) / float64(requests)
	}
	type kv struct {
		k string
		v float64
	}
	var all []kv
	total := 0.0
	for k, v := range m {
		total += v
		if v >= 0.005 {
			all = append(all, kv{strings.ToUpper(k), v})
		}
	}
	slices.SortFunc(all, func(a, b kv) int {
		switch {
		case a.v > b.v:
			return -1
		case a.v < b.v:
			return 1
		}
		return strings.Compare(a.k, b.k)
	})
	parts := make([]string, len(all))
	for i, e := range all {
		parts[i] = fmt.Sprintf("%s %.2f", e.k, e.v)
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%.2f", total)
	}
	return fmt.Sprintf("%.2f (%s)", total, strings.Join(parts, ", "))
}
