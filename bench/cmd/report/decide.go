package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/bench/internal/proc"
)

// benchstatFilter keeps the tables worth reading next to the ones above.
const benchstatFilter = ".unit:(decisions/s OR allocs/op)"

// decideOut is where the raw go test output goes (ignored by git: *.out).
const decideOut = "decide.out"

// report is everything measured, for markdown.
type report struct {
	cfg     config
	args    []string
	started time.Time
	elapsed time.Duration

	cpu, goVersion, redisVersion string
	cores                        int
	loadStart, loadEnd           string

	redis *proc.Redis
	bin   func(name string) string

	failures  []string
	durations []string

	decideRes    benchResults
	benchstatOut string
	httpRows     []*httpRow
	accRows      []accResult
	ceilRows     []ceilRow
	capRows      []capRow
	capMems      []capMem
}

// flushRedis empties the report's redis-server between parts.
func (r *report) flushRedis(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: r.redis.Addr})
	defer c.Close()
	return c.FlushAll(ctx).Err()
}

// decide runs BenchmarkDecide against the report's redis-server, then
// benchstat on its output. The samples are taken in count passes over every
// benchmark (go test -count 1, count times) rather than with -count, which
// takes a benchmark's samples back to back: on a shared machine a burst of
// someone else's load then lands on one library's samples only.
func (r *report) decide(ctx context.Context) error {
	if err := r.flushRedis(ctx); err != nil {
		return err
	}
	args := []string{"test", "-run", "^$", "-bench", "^BenchmarkDecide$", "-benchmem",
		"-count", "1", "-benchtime", r.cfg.benchtime, "-timeout", "30m"}
	args = append(args, ".", "-args", "-batching="+r.cfg.batching)

	f, err := os.Create(decideOut)
	if err != nil {
		return err
	}
	defer f.Close()
	var buf bytes.Buffer
	for pass := 1; pass <= r.cfg.count; pass++ {
		logf("pass %d of %d: go %s", pass, r.cfg.count, strings.Join(args, " "))
		cmd := proc.Command(ctx, r.cfg.goBin, args...)
		cmd.Env = append(os.Environ(), "REDIS_ADDR="+r.redis.Addr)
		cmd.Stdout = io.MultiWriter(f, &buf, &progress{})
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			r.decideRes = parseBench(buf.Bytes())
			return fmt.Errorf("go test, pass %d: %v (output in bench/%s)", pass, err, decideOut)
		}
	}
	r.decideRes = parseBench(buf.Bytes())
	if len(r.decideRes) == 0 {
		return fmt.Errorf("go test printed no benchmark results (bench/%s)", decideOut)
	}
	out, err := runCmd(ctx, r.cfg.goBin, "run", benchstat, "-filter", benchstatFilter, decideOut)
	if err != nil {
		logf("benchstat: %v", err)
		r.benchstatOut = "benchstat failed: " + err.Error()
		return nil
	}
	r.benchstatOut = string(out)
	return nil
}

// progress echoes benchmark result lines to standard error. go test writes
// a benchmark's name when it starts and the rest of the line when it ends.
type progress struct{ line []byte }

func (p *progress) Write(b []byte) (int, error) {
	p.line = append(p.line, b...)
	for {
		i := bytes.IndexByte(p.line, '\n')
		if i < 0 {
			return len(b), nil
		}
		if line := p.line[:i+1]; bytes.HasPrefix(line, []byte("Benchmark")) || bytes.HasPrefix(line, []byte("--- FAIL")) {
			os.Stderr.Write(line)
		}
		p.line = p.line[i+1:]
	}
}

// benchResults maps a benchmark name, without "Benchmark" and the -GOMAXPROCS
// suffix, to its samples (unit → value).
type benchResults map[string][]map[string]float64

// parseBench reads the result lines of go test -bench output.
func parseBench(out []byte) benchResults {
	res := benchResults{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := map[string]float64{}
		for k := 2; k+1 < len(f); k += 2 {
			if v, err := strconv.ParseFloat(f[k], 64); err == nil {
				m[f[k+1]] = v
			}
		}
		res[name] = append(res[name], m)
	}
	return res
}

// median returns the median of unit over name's samples.
func (b benchResults) median(name, unit string) (float64, bool) {
	var v []float64
	for _, s := range b[name] {
		if x, ok := s[unit]; ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
}

// libs returns the libraries benchmarked on backend, in the order of the
// output (tollgate first).
func (b benchResults) libs(backend string) []string {
	var names []string
	for n := range b {
		names = append(names, n)
	}
	slices.Sort(names)
	var libs []string
	for _, n := range names {
		p := strings.Split(n, "/")
		if len(p) == 5 && p[0] == "Decide" && p[1] == backend && !contains(libs, p[2]) {
			libs = append(libs, p[2])
		}
	}
	// tollgate, its variants, then the peers as sorted.
	slices.SortStableFunc(libs, func(a, b string) int {
		return rank(a) - rank(b)
	})
	return libs
}

func rank(lib string) int {
	switch {
	case lib == "tollgate":
		return 0
	case strings.HasPrefix(lib, "tollgate"):
		return 1
	}
	return 2
}

func decideName(backend, lib, workload string, g int) string {
	return fmt.Sprintf("Decide/%s/%s/%s/g%d", backend, lib, workload, g)
}
