// Command report measures tollgate side by side with its peers and writes
// the results as Markdown (BENCHMARKS.md). It starts its own redis-server on
// a free loopback port and runs, in order:
//
//	decide    go test -bench BenchmarkDecide: decisions/s and allocs/op per
//	          library, in memory and on Redis, at 1, 16 and 64 goroutines
//	http      cmd/server per library, loaded by cmd/load in another process
//	accuracy  cmd/accuracy: 4 limiters on 4 clients sharing one key
//	ceiling   redis-benchmark running tollgate's own script
//
// Every ratio is to tollgate within the same run. Each process it starts is
// stopped by PID when its part is done, and dies with the report (its own
// process group, and a parent-death signal on Linux).
//
//	cd bench && go run ./cmd/report -out ../BENCHMARKS.md
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate-go/tollgate/bench/internal/proc"
)

// benchstat is the version the root Makefile uses.
const benchstat = "golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"

type config struct {
	goBin      string
	out        string
	sections   map[string]bool
	count      int
	benchtime  string
	batching   string
	conns      int
	httpDur    time.Duration
	httpRounds int
	capRounds  int
	warmup     time.Duration
	httpKeys   int
	denyCache  int
	accDur     time.Duration
	ceilN      int
	timeout    time.Duration
}

var allSections = []string{"decide", "http", "accuracy", "ceiling", "capacity"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run() error {
	var c config
	var sections string
	flag.StringVar(&c.goBin, "go", "go", "the go command")
	flag.StringVar(&c.out, "out", "BENCHMARKS.md", "Markdown file to write")
	flag.StringVar(&sections, "sections", strings.Join(allSections, ","), "parts to run, comma-separated")
	flag.IntVar(&c.count, "count", 8, "decide: samples per benchmark, in that many passes over all of them (benchstat needs 6 for a 95% interval; more passes make a median less hostage to one pass on a noisy machine)")
	flag.StringVar(&c.benchtime, "benchtime", "110ms", "decide: go test -benchtime")
	flag.StringVar(&c.batching, "batching", "0,4", "n of the tollgate-batch<n> variants (store.WithBatching), when built")
	flag.IntVar(&c.conns, "conns", 64, "http: connections of the load generator")
	flag.DurationVar(&c.httpDur, "http-duration", 2*time.Second, "http: measured duration of each run")
	flag.IntVar(&c.httpRounds, "http-rounds", 2, "http: runs per library, in rounds over all of them")
	flag.IntVar(&c.capRounds, "capacity-rounds", 3, "capacity: runs per row, in rounds over all of them (the median's is reported)")
	flag.DurationVar(&c.warmup, "warmup", 300*time.Millisecond, "http: unmeasured load before each run")
	flag.IntVar(&c.httpKeys, "http-keys", 10_000, "http: client keys of the many-clients workload")
	flag.IntVar(&c.denyCache, "deny-cache", 10_000, "http: maxKeys of the tollgate-denycache variant, when built")
	flag.DurationVar(&c.accDur, "accuracy-duration", 5*time.Second, "accuracy: duration of each run")
	flag.IntVar(&c.ceilN, "ceiling-n", 100_000, "ceiling: redis-benchmark -n of the unpipelined runs")
	flag.DurationVar(&c.timeout, "timeout", 20*time.Minute, "give up after this long")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	c.sections = map[string]bool{}
	for _, s := range strings.Split(sections, ",") {
		s = strings.TrimSpace(s)
		if !contains(allSections, s) {
			return fmt.Errorf("-sections: unknown part %q (have %s)", s, strings.Join(allSections, ", "))
		}
		c.sections[s] = true
	}
	switch {
	case c.count < 1:
		return fmt.Errorf("-count %d: want at least 1", c.count)
	case c.conns < 1, c.httpKeys < 1, c.ceilN < 1, c.httpRounds < 1, c.capRounds < 1:
		return errors.New("-conns, -http-keys, -http-rounds, -capacity-rounds and -ceiling-n must be at least 1")
	case c.httpDur <= 0, c.accDur <= 0, c.timeout <= 0, c.warmup < 0:
		return errors.New("-http-duration, -accuracy-duration and -timeout must be positive")
	}
	if _, err := time.ParseDuration(c.benchtime); err != nil && !strings.HasSuffix(c.benchtime, "x") {
		return fmt.Errorf("-benchtime %q: %w", c.benchtime, err)
	}
	if _, err := os.Stat("go.mod"); err != nil {
		return errors.New("run from the bench module's directory (cd bench)")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	started := time.Now()
	tmp, err := os.MkdirTemp("", "tollgate-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	r := &report{cfg: c, started: started, args: os.Args[1:]}
	if err := r.machine(ctx); err != nil {
		return err
	}

	rdb, err := proc.StartRedis(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err := rdb.Stop(3 * time.Second); err != nil {
			logf("stopping redis-server: %v", err)
		}
	}()
	r.redis = rdb
	logf("redis-server pid %d on %s", rdb.PID(), rdb.Addr)

	if c.sections["http"] || c.sections["accuracy"] {
		if err := r.buildCommands(ctx, tmp); err != nil {
			return err
		}
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"decide", r.decide},
		{"http", r.http},
		{"accuracy", r.accuracy},
		{"ceiling", r.ceiling},
		{"capacity", r.capacity},
	}
	for _, s := range steps {
		if !c.sections[s.name] {
			continue
		}
		if ctx.Err() != nil {
			r.failures = append(r.failures, fmt.Sprintf("%s: not run: %v", s.name, ctx.Err()))
			continue
		}
		t0 := time.Now()
		logf("== %s", s.name)
		if err := s.fn(ctx); err != nil {
			logf("%s failed: %v", s.name, err)
			r.failures = append(r.failures, fmt.Sprintf("%s: %v", s.name, err))
		}
		r.durations = append(r.durations, fmt.Sprintf("%s %s", s.name, time.Since(t0).Round(time.Second)))
	}
	r.elapsed = time.Since(started)
	r.loadEnd = loadAvg()

	md := r.markdown()
	if err := os.WriteFile(c.out, md, 0o644); err != nil {
		return err
	}
	logf("wrote %s in %s", c.out, r.elapsed.Round(time.Second))
	if len(r.failures) > 0 {
		return fmt.Errorf("%d part(s) failed: %s", len(r.failures), strings.Join(r.failures, "; "))
	}
	return nil
}

// buildCommands builds cmd/server, cmd/load and cmd/accuracy into dir.
func (r *report) buildCommands(ctx context.Context, dir string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	args = append(args, "./cmd/server", "./cmd/load", "./cmd/accuracy")
	out, err := exec.CommandContext(ctx, r.cfg.goBin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	r.bin = func(name string) string { return filepath.Join(dir, name) }
	return nil
}

// machine fills in the machine line.
func (r *report) machine(ctx context.Context) error {
	r.cpu = "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				r.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	r.cores = runtime.NumCPU()
	r.loadStart = loadAvg()
	out, err := exec.CommandContext(ctx, r.cfg.goBin, "env", "GOVERSION", "GOOS", "GOARCH").Output()
	if err != nil {
		return fmt.Errorf("%s env: %w", r.cfg.goBin, err)
	}
	f := strings.Fields(string(out))
	r.goVersion = strings.Join(f, " ")
	if len(f) == 3 {
		r.goVersion = f[0] + " " + f[1] + "/" + f[2]
	}
	out, err = exec.CommandContext(ctx, "redis-server", "--version").Output()
	if err != nil {
		return fmt.Errorf("redis-server --version: %w (install redis-server)", err)
	}
	r.redisVersion = "redis-server " + strings.TrimPrefix(fieldWithPrefix(string(out), "v="), "v=")
	return nil
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func fieldWithPrefix(s, prefix string) string {
	for _, f := range strings.Fields(s) {
		if strings.HasPrefix(f, prefix) {
			return f
		}
	}
	return strings.TrimSpace(s)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		// Skip go build's "# package" header.
		if strings.HasPrefix(s, "#") {
			return firstLine(s[i+1:])
		}
		return s[:i]
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s report: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// runCmd runs a command and returns its standard output; standard error is
// returned in the error.
func runCmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := proc.Command(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
