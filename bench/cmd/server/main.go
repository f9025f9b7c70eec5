// Command server serves one rate-limiting library as middleware on a
// net/http server, for cmd/load to measure from another process.
//
//	server -lib tollgate -store redis -redis 127.0.0.1:6379 -limit 100
//
// Every library keys requests by the X-Client header (a request without one
// is refused by the middleware). The handler behind the limiter answers 200
// with a two-byte body. GET /debug/redis, outside the limiter, answers the
// Redis commands the go-redis client has sent and the round trips they took
// (a pipeline is one), as JSON. The server prints "listening on <addr>" once
// it accepts connections, and stops on SIGINT or SIGTERM, after
// -max-lifetime, or, with -exit-on-eof, when its standard input closes (its
// parent died).
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
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/bench/peers"
	"github.com/tollgate-go/tollgate/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		lib       = flag.String("lib", peers.Tollgate, "library: "+strings.Join(allLibs(), ", ")+", bare (no middleware) or bare-fields (five constant rate-limit fields)")
		backend   = flag.String("store", peers.Memory, "store: memory or redis")
		redisAddr = flag.String("redis", "127.0.0.1:6379", "Redis address, for -store redis")
		pool      = flag.Int("pool", 64, "PoolSize of the go-redis client")
		limit     = flag.Int("limit", 100, "requests per -period per client")
		period    = flag.Duration("period", time.Second, "period of -limit")
		burst     = flag.Int("burst", 0, "bucket capacity (0: -limit); only token-bucket libraries have one")
		batching  = flag.Int("batching", -1, "tollgate on Redis: store.WithBatching(n); -1 leaves the store's default")
		denyCache = flag.Int("deny-cache", 0, "tollgate: middleware.WithDenyCache(maxKeys); 0 leaves it off")
		noHeaders = flag.Bool("no-headers", false, "tollgate: middleware.WithHeaders(0), no rate-limit headers")
		addr      = flag.String("addr", "127.0.0.1:0", "listen address")
		lifetime  = flag.Duration("max-lifetime", 10*time.Minute, "exit after this long whatever happens")
		eofExit   = flag.Bool("exit-on-eof", false, "exit when standard input closes")
		cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if *burst == 0 {
		*burst = *limit
	}
	cfg := peers.Config{
		Lib:       *lib,
		Backend:   *backend,
		Limit:     store.Limit{Rate: *limit, Period: *period, Burst: *burst},
		DenyCache: *denyCache,
		NoHeaders: *noHeaders,
	}
	if *batching >= 0 {
		cfg.Batching = batching
	}
	if *backend == peers.Redis {
		// ContextTimeoutEnabled, as tollgate's store requires: socket I/O
		// ends at a context's deadline. Only tollgate sets one.
		client := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: *pool, ContextTimeoutEnabled: true})
		defer client.Close()
		client.AddHook(&counts)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := client.Ping(ctx).Err()
		cancel()
		if err != nil {
			return fmt.Errorf("redis at %s: %w", *redisAddr, err)
		}
		cfg.Client = client
	}
	var err error
	mw := func(h http.Handler) http.Handler { return h } // -lib bare: the handler alone
	if *lib == "bare-fields" {
		mw = withFields
	} else if *lib != "bare" {
		var closeLimiter func() error
		mw, closeLimiter, err = peers.NewMiddleware(cfg, clientKey)
		if err != nil {
			return err
		}
		defer closeLimiter()
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	ok := []byte("ok")
	mux := http.NewServeMux()
	mux.Handle("/", mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write(ok)
	})))
	mux.HandleFunc("GET /debug/redis", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"commands":%d,"round_trips":%d}`+"\n", counts.commands.Load(), counts.roundTrips.Load())
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *lifetime)
	defer cancel()
	if *eofExit {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Printf("listening on %s\n", ln.Addr())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShutdown()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// fields are five rate-limit fields of the shape tollgate writes by default.
var fields = http.Header{
	"Ratelimit-Policy": {`"bench";q=10000000;w=1`}, "Ratelimit": {`"bench";r=99999999;t=1`},
	"Ratelimit-Limit": {"10000000"}, "Ratelimit-Remaining": {"99999999"}, "Ratelimit-Reset": {"1"},
}

// withFields is -lib bare-fields: the handler behind no limiter, after the
// five fields are set, each a map entry of a slice made once. It is what
// net/http charges for them, which no middleware that writes them avoids.
func withFields(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for k, v := range fields {
			h[k] = v
		}
		next.ServeHTTP(w, r)
	})
}

// counts counts what the go-redis client sends.
var counts redisCounts

// redisCounts is a go-redis hook that counts commands and round trips.
type redisCounts struct {
	commands, roundTrips atomic.Int64
}

func (c *redisCounts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *redisCounts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.commands.Add(1)
		c.roundTrips.Add(1)
		return next(ctx, cmd)
	}
}

func (c *redisCounts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.commands.Add(int64(len(cmds)))
		c.roundTrips.Add(1)
		return next(ctx, cmds)
	}
}

// errNoClient is the answer for a request without X-Client.
var errNoClient = errors.New("no X-Client header")

// clientKey is the key function of every library: the X-Client header.
func clientKey(r *http.Request) (string, error) {
	if k := r.Header.Get("X-Client"); k != "" {
		return k, nil
	}
	return "", errNoClient
}

func allLibs() []string {
	seen := map[string]bool{}
	var libs []string
	for _, b := range []string{peers.Memory, peers.Redis} {
		for _, l := range peers.Libs(b) {
			if !seen[l] {
				seen[l] = true
				libs = append(libs, l)
			}
		}
	}
	return libs
}
