package tollgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// TestMain runs this test binary as an app server when TestFaultAppPause
// starts it as one (TOLLGATE_APP_REDIS set), and the tests otherwise.
func TestMain(m *testing.M) {
	if addr := os.Getenv("TOLLGATE_APP_REDIS"); addr != "" {
		appServer(addr, os.Getenv("TOLLGATE_APP_PREFIX"), os.Getenv("TOLLGATE_APP_POLICY"))
		return
	}
	os.Exit(m.Run())
}

// appPauseLimit is the limit of the app servers of TestFaultAppPause.
var appPauseLimit = store.Limit{Rate: 50, Period: time.Second, Burst: 10}

// appServer serves one limiter on Redis at addr, all requests on one key,
// with the default options (or FailOpen), on a loopback port that it
// prints; it runs until killed, or for a minute at most.
func appServer(addr, prefix, policy string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 8})
	opts := []middleware.Option{quiet, middleware.WithName("apppause"), middleware.WithKeyFunc(mustKey(keyfuncs.Static("flooder")))}
	if policy == "FailOpen" {
		opts = append(opts, middleware.WithFailurePolicy(middleware.FailOpen))
	}
	l, err := middleware.New(store.NewRedis(rdb, store.WithKeyPrefix(prefix)), appPauseLimit, opts...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("listening", ln.Addr())
	time.AfterFunc(time.Minute, func() { os.Exit(0) }) // never outlives a test run
	mux := http.NewServeMux()
	mux.Handle("/", l.Handler(faultOK))
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, l.Stats().StoreErrors) })
	_ = http.Serve(ln, mux)
}

// startAppServer starts an app server process and returns it and its URL.
func startAppServer(t *testing.T, redisAddr, prefix, policy string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TOLLGATE_APP_REDIS="+redisAddr, "TOLLGATE_APP_PREFIX="+prefix, "TOLLGATE_APP_POLICY="+policy)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("app server: %q, %v", line, err)
	}
	return cmd, "http://" + addr + "/"
}

// TestFaultAppPause: two app server processes share one Redis; one client
// floods both from 64 goroutines for 3 s, and one app process is paused
// (SIGSTOP) for 0.15 s in the middle, as a GC pause or CPU throttling would.
// Its Redis calls in flight outlive their budget meanwhile and fail at
// once when it resumes, which opens its breaker. With the default options
// (FailLocal) the client gets at most the limit's allowance plus, per
// server, what the local fallback allows over the pause and the cooldown
// after; FailOpen, run and logged beside it, lets that second through.
func TestFaultAppPause(t *testing.T) {
	srv := redistest.Server(t)
	for _, policy := range []string{"default", "FailOpen"} {
		prefix := fmt.Sprintf("faults:apppause:%s:%d:", policy, time.Now().UnixNano())
		paused, url0 := startAppServer(t, srv.Addr, prefix, policy)
		_, url1 := startAppServer(t, srv.Addr, prefix, policy)
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
		const run, pause = 3 * time.Second, 150 * time.Millisecond
		var allowed, other atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for g := range 64 {
			url := []string{url0, url1}[g%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < run {
					resp, err := client.Get(url)
					if err != nil {
						other.Add(1)
						continue
					}
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						allowed.Add(1)
					case http.StatusTooManyRequests:
					default:
						other.Add(1)
					}
				}
			}()
		}
		time.Sleep(run / 2)
		p0 := time.Now()
		paused.Process.Signal(syscall.SIGSTOP)
		time.Sleep(pause)
		paused.Process.Signal(syscall.SIGCONT)
		stopped := time.Since(p0) // longer than pause on a loaded machine
		wg.Wait()
		storeErrors := ""
		if resp, err := client.Get(url0 + "stats"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			storeErrors = string(b)
		}
		client.CloseIdleConnections()
		elapsed := time.Since(start)
		// The paused server's store calls fail for the pause and until its breaker closes again.
		failing := stopped + middleware.DefaultBreakerCooldown + 5*middleware.DefaultTimeout
		shared, most := floodBound(appPauseLimit, elapsed, failing, failing)
		t.Logf("2 app servers, %s policy, flood for %v, one paused %v (store errors there: %s): %d allowed; shared allowance %.0f, at most %.0f with the local fallback",
			policy, elapsed.Round(time.Millisecond), stopped.Round(time.Millisecond), storeErrors, allowed.Load(), shared, most)
		if policy == "default" && float64(allowed.Load()) > most {
			t.Errorf("%d allowed; want at most %.0f: an app pause must not open the gate", allowed.Load(), most)
		}
		if other.Load() != 0 {
			t.Errorf("%s: %d answers other than 200 and 429", policy, other.Load())
		}
	}
}
