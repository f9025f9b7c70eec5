// Command demo starts a server behind a tollgate limiter, fires a burst of
// requests at it and prints what each response says: its status, the
// RateLimit header (r: requests left, t: seconds until one more), the
// RateLimit-Policy header (q requests per w seconds) and, on a 429, the
// Retry-After header. It then waits as long as Retry-After says, shows that
// the next request passes, and exits.
//
//	go run ./examples/demo
//	go run ./examples/demo -n 12
//	REDIS_ADDR=localhost:6379 go run ./examples/demo
//
// The limit is 5 requests per 2 seconds per client IP. The store is Redis
// at REDIS_ADDR, or, when that is unset, an embedded miniredis.
//
// With -serve the demo keeps serving, on 127.0.0.1:8080 unless -addr says
// otherwise, with a limit of 5 requests per 30 seconds, slow enough to reach
// by hand, and prints curl commands to try, until Ctrl-C:
//
//	go run ./examples/demo -serve
//	curl -i http://127.0.0.1:8080/
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// The demo's limits: a burst of 5, then one request every 400ms (burst
// mode) or every 6s (serve mode).
var (
	burstLimit = store.Limit{Rate: 5, Period: 2 * time.Second, Burst: 5}
	serveLimit = store.Limit{Rate: 5, Period: 30 * time.Second, Burst: 5}
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run runs the demo as the command line args say, writing to out. It
// returns when the burst is done, or, with -serve, when ctx ends.
func run(ctx context.Context, out io.Writer, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(out)
	serve := fs.Bool("serve", false, "keep serving until Ctrl-C, and print curl commands to try")
	addr := fs.String("addr", "", "listen address (default 127.0.0.1:0, a free port; with -serve, 127.0.0.1:8080)")
	n := fs.Int("n", 8, "requests in the burst")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *n < 1 {
		return fmt.Errorf("-n %d: want at least 1 request", *n)
	}
	limit := burstLimit
	if *serve {
		limit = serveLimit
	}
	if *addr == "" {
		*addr = "127.0.0.1:0"
		if *serve {
			*addr = "127.0.0.1:8080"
		}
	}

	st, budget, closeStore, err := openStore(out, os.Getenv("REDIS_ADDR"))
	if err != nil {
		return err
	}
	defer closeStore()
	lim, err := middleware.New(st, limit, middleware.WithName("demo"), middleware.WithTimeout(budget))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "limit %q: %d requests per %v per client IP\n", lim.Name(), limit.Burst, limit.Period)

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: lim.Handler(http.HandlerFunc(hello)), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/"

	if *serve {
		fmt.Fprintf(out, "serving on %s until Ctrl-C; try:\n", url)
		fmt.Fprintf(out, "  curl -i %s\n", url)
		fmt.Fprintf(out, "  for i in 1 2 3 4 5 6; do curl -si %s | grep -iE '^(HTTP|RateLimit:|Retry-After)'; done\n", url)
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "shutting down")
		case err := <-served:
			return err
		}
	} else {
		fmt.Fprintf(out, "server: %s\n", url)
		err = burst(ctx, out, url, *n)
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(err, srv.Shutdown(shutdownCtx))
}

func hello(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, "hello")
}

// burst sends n requests to url one after another, then, if one was
// refused, waits as long as its Retry-After said and sends one more, which
// must pass.
func burst(ctx context.Context, out io.Writer, url string, n int) error {
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	var p printer
	fmt.Fprintf(out, "sending %d requests, one after another:\n", n)
	fmt.Fprintln(out, "  (RateLimit: r requests left, t seconds until one more; RateLimit-Policy: q requests per w seconds)")
	var retryAfter string
	for i := 1; i <= n; i++ {
		resp, err := get(ctx, client, url)
		if err != nil {
			return err
		}
		p.print(out, i, resp)
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			retryAfter = ra
		}
	}
	if retryAfter == "" {
		fmt.Fprintln(out, "no request was refused: try a larger -n")
		return nil
	}
	secs, err := strconv.Atoi(retryAfter)
	if err != nil || secs < 1 {
		return fmt.Errorf("Retry-After %q: want whole seconds, at least 1", retryAfter)
	}
	fmt.Fprintf(out, "waiting %ds, as Retry-After says...\n", secs)
	select {
	case <-time.After(time.Duration(secs) * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	resp, err := get(ctx, client, url)
	if err != nil {
		return err
	}
	p.print(out, n+1, resp)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("request %d, after waiting Retry-After: got status %d, want 200", n+1, resp.StatusCode)
	}
	return nil
}

func get(ctx context.Context, client *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

// printer prints one line per response, with RateLimit-Policy only when it
// is new.
type printer struct{ policy string }

func (p *printer) print(out io.Writer, i int, resp *http.Response) {
	line := fmt.Sprintf("  #%-2d %-22s RateLimit: %s", i, resp.Status, resp.Header.Get("RateLimit"))
	if policy := resp.Header.Get("RateLimit-Policy"); policy != p.policy {
		p.policy = policy
		line += "   RateLimit-Policy: " + policy
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		line += "   Retry-After: " + ra
	}
	fmt.Fprintln(out, line)
}

// openStore returns a Redis store on the server at addr or, when addr is
// empty, on an embedded miniredis, the budget of one decision on it, and a
// function that closes what it opened. The embedded miniredis runs in this
// process, on its CPU: on a loaded machine a decision can take longer than
// a Redis server's budget, so it gets a second.
func openStore(out io.Writer, addr string) (store.Store, time.Duration, func(), error) {
	var mr *miniredis.Miniredis
	if addr == "" {
		var err error
		if mr, err = miniredis.Run(); err != nil {
			return nil, 0, nil, err
		}
		addr = mr.Addr()
		fmt.Fprintln(out, "store: an embedded miniredis (set REDIS_ADDR=host:port to use a Redis server)")
	} else {
		fmt.Fprintf(out, "store: Redis at %s\n", addr)
	}
	// Timeouts fit for a rate limiter (see examples/chi), or for the embedded one.
	rw, budget := 100*time.Millisecond, middleware.DefaultTimeout
	if mr != nil {
		rw, budget = time.Second, time.Second
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           rw,
		WriteTimeout:          rw,
		PoolTimeout:           100 * time.Millisecond,
		ContextTimeoutEnabled: true,
	})
	return store.NewRedis(rdb), budget, func() {
		rdb.Close()
		if mr != nil {
			mr.Close()
		}
	}, nil
}
