// Command accuracy measures how closely each Redis rate limiter holds a
// limit shared by several app servers: -instances independent limiters, each
// with its own go-redis client, decide for one key from -goroutines
// goroutines in all (closed loop, as fast as Redis answers) for -d, and the
// allowed decisions are counted.
//
//	accuracy -redis 127.0.0.1:6379 -d 5s
//
// A token bucket of -rate per second and capacity -burst allows at most
// burst + rate×d in that time. Each library is run with -instances and, with
// -baseline, again as a single instance with the same number of goroutines.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/bench/peers"
	"github.com/tollgate-go/tollgate/store"
)

// Result is one run; -json prints one per line.
type Result struct {
	Lib        string  `json:"lib"`
	Instances  int     `json:"instances"`
	Goroutines int     `json:"goroutines"`
	Seconds    float64 `json:"seconds"`
	Decisions  int64   `json:"decisions"`
	Allowed    int64   `json:"allowed"`
	Errors     int64   `json:"errors"`
	Ideal      float64 `json:"ideal"` // burst + rate × -d
	FirstError string  `json:"first_error,omitempty"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "accuracy:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		addr       = flag.String("redis", "127.0.0.1:6379", "Redis address")
		libs       = flag.String("libs", strings.Join(peers.Libs(peers.Redis), ","), "comma-separated libraries")
		batching   = flag.String("batching", "", "comma-separated n: also run tollgate-batch<n> with store.WithBatching(n)")
		d          = flag.Duration("d", 5*time.Second, "duration of each run")
		goroutines = flag.Int("goroutines", 64, "goroutines in all, spread over the instances")
		instances  = flag.Int("instances", 4, "independent limiters, each with its own client")
		rate       = flag.Int("rate", 100, "tokens per second")
		burst      = flag.Int("burst", 50, "bucket capacity")
		baseline   = flag.Bool("baseline", false, "also run each library as a single instance")
		asJSON     = flag.Bool("json", false, "print results as JSON, one per line")
	)
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	case *d <= 0:
		return errors.New("-d must be positive")
	case *instances < 1 || *goroutines < *instances:
		return fmt.Errorf("-instances %d, -goroutines %d: want 1 <= instances <= goroutines", *instances, *goroutines)
	}
	limit := store.Limit{Rate: *rate, Period: time.Second, Burst: *burst}
	if err := limit.Validate(); err != nil {
		return fmt.Errorf("-rate, -burst: %w", err)
	}
	var runs []run1
	for _, lib := range strings.Split(*libs, ",") {
		runs = append(runs, run1{name: strings.TrimSpace(lib), lib: strings.TrimSpace(lib)})
	}
	if *batching != "" {
		for _, f := range strings.Split(*batching, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("-batching: %q is not a count of pipelines", f)
			}
			runs = append(runs, run1{name: fmt.Sprintf("tollgate-batch%d", n), lib: peers.Tollgate, batching: &n})
		}
	}
	counts := []int{*instances}
	if *baseline && *instances != 1 {
		counts = append(counts, 1)
	}
	for _, r := range runs {
		for _, n := range counts {
			res, err := r.measure(*addr, limit, n, *goroutines, *d)
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			if *asJSON {
				if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
					return err
				}
				continue
			}
			fmt.Printf("%-18s %d instance(s), %d goroutines, %.2fs: %d allowed of %d decisions (ideal %.0f: %.3f), %d errors\n",
				res.Lib, res.Instances, res.Goroutines, res.Seconds, res.Allowed, res.Decisions,
				res.Ideal, float64(res.Allowed)/res.Ideal, res.Errors)
		}
	}
	return nil
}

// run1 is one library with its options.
type run1 struct {
	name     string
	lib      string
	batching *int
}

func (r run1) measure(addr string, limit store.Limit, instances, goroutines int, d time.Duration) (Result, error) {
	key := fmt.Sprintf("acc:%s:%d:%d", r.name, instances, time.Now().UnixNano())
	deciders := make([]peers.Decider, instances)
	for i := range deciders {
		// ContextTimeoutEnabled, as tollgate's store requires; every library
		// gets the same client options.
		client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: goroutines / instances, ContextTimeoutEnabled: true})
		defer client.Close()
		dec, err := peers.NewDecider(peers.Config{
			Lib: r.lib, Backend: peers.Redis, Client: client, Limit: limit, Batching: r.batching,
		})
		if err != nil {
			return Result{}, err
		}
		defer dec.Close()
		// Open the connections before the clock starts, on another key.
		if _, err := dec.Decide(context.Background(), key+":warm"); err != nil {
			return Result{}, fmt.Errorf("first decision: %w", err)
		}
		deciders[i] = dec
	}

	var decisions, allowed, errs atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		dec := deciders[g%instances]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// Background: a decision in flight at the end is counted,
				// not cut off.
				ok, err := dec.Decide(context.Background(), key)
				decisions.Add(1)
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				case ok:
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res := Result{
		Lib:        r.name,
		Instances:  instances,
		Goroutines: goroutines,
		Seconds:    time.Since(start).Seconds(),
		Decisions:  decisions.Load(),
		Allowed:    allowed.Load(),
		Errors:     errs.Load(),
		Ideal:      float64(limit.Burst) + float64(limit.Rate)*d.Seconds(),
	}
	if e := firstErr.Load(); e != nil {
		res.FirstError = (*e).Error()
	}
	return res, nil
}
