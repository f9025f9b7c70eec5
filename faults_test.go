package tollgate_test

// Fault tests against real redis-server processes that the tests start,
// break and repair themselves (internal/redistest): a killed and restarted
// server, a hung server under FailClosed, a killed Cluster master and a
// Sentinel failover. Each test stops by itself and logs one row of
//
//	fault | policy | requests | answered within budget | p99 | wrong decisions

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// faultSlack is what a request may take beyond the decision budget on an
// idle machine; stallMeter adds what a loaded one delays goroutines by.
const faultSlack = 20 * time.Millisecond

// A stallMeter measures how late this process's goroutines run while a test
// lasts: a ticker due every 2ms records by how much it woke late, so that a
// latency bound widens by the stall the machine imposed (a loaded 2-core
// machine delays a request beyond its budget without the limiter at fault).
type stallMeter struct {
	worst atomic.Int64 // the longest lateness seen, in nanoseconds
	stop  chan struct{}
	done  chan struct{}
}

func startStallMeter(t *testing.T) *stallMeter {
	m := &stallMeter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		const every = 2 * time.Millisecond
		for {
			start := time.Now()
			select {
			case <-m.stop:
				return
			case <-time.After(every):
			}
			if late := time.Since(start) - every; late > time.Duration(m.worst.Load()) {
				m.worst.Store(int64(late))
			}
		}
	}()
	t.Cleanup(func() {
		close(m.stop)
		<-m.done
		t.Logf("stall meter: goroutines ran up to %v late", time.Duration(m.worst.Load()).Round(time.Millisecond))
	})
	return m
}

// slack is faultSlack plus the longest stall measured so far.
func (m *stallMeter) slack() time.Duration { return faultSlack + time.Duration(m.worst.Load()) }

var faultOK = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	io.WriteString(w, "ok")
})

func faultLimiter(t *testing.T, s store.Store, lim store.Limit, opts ...middleware.Option) http.Handler {
	t.Helper()
	l, err := middleware.New(s, lim, append([]middleware.Option{quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l.Handler(faultOK)
}

// faultResp is one answered request.
type faultResp struct {
	code       int
	rateLimit  string // the RateLimit header: set when the store decided
	retryAfter string
	took       time.Duration
}

func faultServe(h http.Handler, subject string) faultResp {
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	if subject != "" {
		r.Header.Set("X-Subject", subject)
	}
	start := time.Now()
	h.ServeHTTP(w, r)
	took := time.Since(start)
	return faultResp{w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"), took}
}

// rawSubject keys a request by its X-Subject header as it is (keyfuncs.Header
// would hash it), so that a test can compute the store key and its slot.
func rawSubject(r *http.Request) (string, error) {
	if s := r.Header.Get("X-Subject"); s != "" {
		return s, nil
	}
	return "", keyfuncs.ErrNoKey
}

func faultPercentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(float64(len(s)-1)*p)]
}

// faultRow logs the test's table row.
func faultRow(t *testing.T, fault, policy string, requests, inBudget int, p99 time.Duration, wrong int) {
	t.Helper()
	t.Logf("ROW | %s | %s | %d | %d/%d | %v | %d",
		fault, policy, requests, inBudget, requests, p99.Round(10*time.Microsecond), wrong)
}

// singleClient is a go-redis client whose every call ends at the context's
// deadline and is never retried.
func singleClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialTimeout:           50 * time.Millisecond,
		ReadTimeout:           50 * time.Millisecond,
		WriteTimeout:          50 * time.Millisecond,
		PoolTimeout:           50 * time.Millisecond,
		PoolSize:              8,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestFaultKillRestart kills redis-server (SIGKILL): FailOpen answers every
// request within the budget; after a restart on the same port limiting
// resumes by itself, and no goroutine is left behind.
func TestFaultKillRestart(t *testing.T) {
	leaktest.Check(t) // first: every cleanup below runs before the check
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a redis-server of its own to kill")
	}
	const budget = 50 * time.Millisecond
	stall := startStallMeter(t)
	rdb := singleClient(t, srv.Addr)
	h := faultLimiter(t, store.NewRedis(rdb, store.WithKeyPrefix("faults:kill:")), store.PerMinute(5),
		middleware.WithName("kill"), middleware.WithTimeout(budget),
		middleware.WithFailurePolicy(middleware.FailOpen),
		middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Subject"))))

	if r := faultServe(h, "warmup"); r.code != 200 || r.rateLimit == "" {
		t.Fatalf("healthy: %d RateLimit %q", r.code, r.rateLimit)
	}

	srv.Kill()
	const n = 200
	var lat []time.Duration
	inBudget, wrong := 0, 0
	for k := range n {
		// Subjects that would be over the limit if Redis were deciding:
		// FailOpen must let them through anyway.
		r := faultServe(h, fmt.Sprintf("s%d", k%3))
		lat = append(lat, r.took)
		if r.took <= budget+stall.slack() {
			inBudget++
		}
		if r.code != 200 || r.rateLimit != "" {
			wrong++
		}
	}
	p99 := faultPercentile(lat, 0.99)
	faultRow(t, "redis-server killed (SIGKILL)", "FailOpen, budget 50ms", n, inBudget, p99, wrong)
	if inBudget != n || wrong != 0 {
		t.Errorf("killed: %d/%d within %v, %d not a plain 200; max %v",
			inBudget, n, budget+stall.slack(), wrong, faultPercentile(lat, 1))
	}

	srv.Restart()
	restarted := time.Now()
	for {
		if r := faultServe(h, "probe"); r.rateLimit != "" {
			break
		}
		if time.Since(restarted) > 3*time.Second {
			t.Fatalf("limiting did not resume within 3s of the restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("limiting resumed %v after the restart (same port %d, new pid %d)",
		time.Since(restarted).Round(time.Millisecond), srv.Port, srv.PID())

	// The restart lost every bucket: a fresh subject gets the full burst of
	// 5, and the 6th is refused.
	for k := 1; k <= 6; k++ {
		r := faultServe(h, "after-restart")
		want := 200
		if k == 6 {
			want = 429
		}
		if r.code != want || r.rateLimit == "" {
			t.Fatalf("after the restart, request %d: %d RateLimit %q; want %d with headers", k, r.code, r.rateLimit, want)
		}
	}
}

// TestFaultFailClosed hangs redis-server (SIGSTOP): FailClosed refuses every
// request with 503 and Retry-After within the budget, and decides again
// after SIGCONT.
func TestFaultFailClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a redis-server of its own to stop")
	}
	const budget = 50 * time.Millisecond
	stall := startStallMeter(t)
	rdb := singleClient(t, srv.Addr)
	h := faultLimiter(t, store.NewRedis(rdb, store.WithKeyPrefix("faults:closed:")), store.PerMinute(5),
		middleware.WithName("closed"), middleware.WithTimeout(budget),
		middleware.WithFailurePolicy(middleware.FailClosed),
		middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Subject"))))

	if r := faultServe(h, "warmup"); r.code != 200 || r.rateLimit == "" {
		t.Fatalf("healthy: %d RateLimit %q", r.code, r.rateLimit)
	}

	srv.Pause()
	const n = 200
	var lat []time.Duration
	inBudget, wrong := 0, 0
	for k := range n {
		r := faultServe(h, fmt.Sprintf("s%d", k%3))
		lat = append(lat, r.took)
		if r.took <= budget+stall.slack() {
			inBudget++
		}
		if r.code != http.StatusServiceUnavailable || r.retryAfter == "" {
			wrong++
		}
	}
	p99 := faultPercentile(lat, 0.99)
	faultRow(t, "redis-server hung (SIGSTOP)", "FailClosed, budget 50ms", n, inBudget, p99, wrong)
	if inBudget != n || wrong != 0 {
		t.Errorf("hung: %d/%d within %v, %d not 503 with Retry-After; max %v",
			inBudget, n, budget+stall.slack(), wrong, faultPercentile(lat, 1))
	}

	srv.Resume()
	resumed := time.Now()
	for {
		r := faultServe(h, "probe")
		if r.rateLimit != "" && (r.code == 200 || r.code == 429) {
			break
		}
		if time.Since(resumed) > 2*time.Second {
			t.Fatalf("still %d without a decision 2s after SIGCONT", r.code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("decisions (200/429 with headers) again %v after SIGCONT", time.Since(resumed).Round(time.Millisecond))
	// Limiting, not just answering: burst 5 of a fresh subject, then 429.
	for k := 1; k <= 6; k++ {
		r := faultServe(h, "after-resume")
		if want := map[bool]int{true: 429, false: 200}[k == 6]; r.code != want {
			t.Fatalf("after SIGCONT, request %d: %d, want %d", k, r.code, want)
		}
	}
}

// TestFaultClusterMasterKilled kills one master of a 3-master, 3-replica
// Cluster: keys on the other shards never fail; the killed shard's key is
// refused (FailClosed) until its replica is promoted and the client has
// followed, then decided again.
//
// The nodes run with cluster-require-full-coverage no: with the default
// (yes) every node answers CLUSTERDOWN for every key from the moment the
// master is marked FAIL until its replica takes over, so no shard could
// keep working through a failover.
func TestFaultClusterMasterKilled(t *testing.T) {
	t.Parallel()
	cl := redistest.Cluster(t, redistest.Replicas(1),
		redistest.NodeArgs("--cluster-require-full-coverage", "no"))
	if cl.External {
		t.Skip("needs a cluster of its own to kill a master of")
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 cl.Addrs,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		MaxRedirects:          3,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		PoolTimeout:           100 * time.Millisecond,
	})
	t.Cleanup(func() { cc.Close() })

	const name = "cluster"
	st := store.NewRedis(cc)
	// The Redis key of a subject's bucket (subjects here hold no brace):
	// on a Cluster the store puts a hash tag of its own in front.
	storeKey := func(subject string) string { return st.Key(name + ":" + subject) }
	const budget = 100 * time.Millisecond
	stall := startStallMeter(t)
	h := faultLimiter(t, st, store.PerSecond(1000),
		middleware.WithName(name), middleware.WithTimeout(budget),
		middleware.WithFailurePolicy(middleware.FailClosed),
		middleware.WithBreaker(0, 0), // one shared breaker would fail every shard
		middleware.WithKeyFunc(rawSubject))

	// One subject per master; the first one's master is killed.
	victim := cl.MasterFor(storeKey("k0"))
	subjects := []string{"k0"}
	seen := map[string]bool{victim.Addr: true}
	for k := 1; len(seen) < 3 && k < 1000; k++ {
		s := fmt.Sprintf("k%d", k)
		if m := cl.MasterFor(storeKey(s)); !seen[m.Addr] {
			seen[m.Addr] = true
			subjects = append(subjects, s)
		}
	}
	if len(subjects) != 3 {
		t.Fatalf("found subjects on %d masters, want 3", len(subjects))
	}
	for _, s := range subjects {
		if r := faultServe(h, s); r.code != 200 || r.rateLimit == "" {
			t.Fatalf("healthy, %s: %d RateLimit %q", s, r.code, r.rateLimit)
		}
	}

	victim.Kill()
	killed := time.Now()
	var lat []time.Duration
	requests, inBudget, otherFailures := 0, 0, 0
	var firstFail, lastFail time.Time
	victimFails := 0
	recovered, promoted := time.Duration(0), time.Duration(0)
	lastAsk := time.Time{}
	for time.Since(killed) < 15*time.Second {
		// When the cluster itself has moved the slot to the replica.
		if promoted == 0 && time.Since(lastAsk) > 100*time.Millisecond {
			lastAsk = time.Now()
			if cl.MasterFor(storeKey(subjects[0])) != victim {
				promoted = time.Since(killed)
			}
		}
		for i, s := range subjects {
			r := faultServe(h, s)
			requests++
			lat = append(lat, r.took)
			if r.took <= budget+stall.slack() {
				inBudget++
			}
			ok := r.code == 200 && r.rateLimit != ""
			switch {
			case i > 0 && !ok:
				otherFailures++
			case i == 0 && !ok:
				if r.code != http.StatusServiceUnavailable {
					otherFailures++ // FailClosed must answer 503, nothing else
				}
				victimFails++
				if firstFail.IsZero() {
					firstFail = time.Now()
				}
				lastFail = time.Now()
			}
		}
		if recovered == 0 && !lastFail.IsZero() && time.Since(lastFail) > time.Second {
			recovered = lastFail.Sub(killed)
		}
		if recovered > 0 && time.Since(killed) > recovered+2*time.Second {
			break // two seconds of success on every shard after the outage
		}
		time.Sleep(5 * time.Millisecond)
	}
	p99 := faultPercentile(lat, 0.99)
	faultRow(t, "cluster master killed (1 of 3, replica promoted)", "FailClosed, budget 100ms, no breaker",
		requests, inBudget, p99, otherFailures)
	newMaster := cl.MasterFor(storeKey(subjects[0]))
	t.Logf("killed shard's key: %d refusals, outage %v (first %v, last %v after the kill); "+
		"replica promoted (CLUSTER SLOTS) %v after the kill; now served by %s (was %s)",
		victimFails, recovered.Round(time.Millisecond), sinceOrZero(firstFail, killed), sinceOrZero(lastFail, killed),
		promoted.Round(time.Millisecond), newMaster.Addr, victim.Addr)
	if promoted > 0 && recovered > promoted+2*time.Second {
		// A dead master sends no MOVED; store.Redis asks the ClusterClient
		// to reload its slot map on connection errors, so the key must
		// follow the promoted replica promptly (go-redis alone waits until
		// its map is 10s old).
		t.Errorf("the key recovered %v after the promotion; want within 2s",
			(recovered - promoted).Round(time.Millisecond))
	}
	if otherFailures != 0 {
		t.Errorf("%d failed decisions for keys on the other shards (or non-503 refusals); want 0", otherFailures)
	}
	if victimFails == 0 {
		t.Errorf("the killed shard's key never failed: was its master really killed?")
	}
	if recovered == 0 {
		t.Errorf("the killed shard's key did not recover within 15s (last failure %v after the kill)",
			sinceOrZero(lastFail, killed))
	}
	if inBudget != requests {
		t.Errorf("%d/%d requests within %v; max %v", inBudget, requests, budget+stall.slack(), faultPercentile(lat, 1))
	}
}

func sinceOrZero(t, from time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(from).Round(time.Millisecond)
}

// TestFaultSentinelFailover kills the master of a Sentinel setup: the same
// failover client follows the promoted replica and limiting works again
// without a restart of the app.
func TestFaultSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.Sentinel(t)
	if s.External {
		t.Skip("needs a Sentinel setup of its own to kill the master of")
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            s.MasterName,
		SentinelAddrs:         s.SentinelAddrs,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		PoolTimeout:           100 * time.Millisecond,
	})
	t.Cleanup(func() { rdb.Close() })
	const budget = 100 * time.Millisecond
	stall := startStallMeter(t)
	h := faultLimiter(t, store.NewRedis(rdb, store.WithKeyPrefix("faults:sentinel:")), store.PerSecond(1000),
		middleware.WithName("sentinel"), middleware.WithTimeout(budget),
		middleware.WithFailurePolicy(middleware.FailOpen),
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("everyone"))))

	if r := faultServe(h, ""); r.code != 200 || r.rateLimit == "" {
		t.Fatalf("healthy: %d RateLimit %q", r.code, r.rateLimit)
	}
	old := s.Master.Addr
	s.Master.Kill()
	killed := time.Now()
	var lat []time.Duration
	requests, inBudget, wrong, undecided := 0, 0, 0, 0
	var back time.Duration
	for time.Since(killed) < 20*time.Second {
		r := faultServe(h, "")
		requests++
		lat = append(lat, r.took)
		if r.took <= budget+stall.slack() {
			inBudget++
		}
		if r.code != 200 {
			wrong++ // FailOpen while down, and 1000/s is never exceeded here
		}
		if r.rateLimit != "" {
			back = time.Since(killed)
			break
		}
		undecided++
		time.Sleep(10 * time.Millisecond)
	}
	p99 := faultPercentile(lat, 0.99)
	faultRow(t, "sentinel master killed (failover)", "FailOpen, budget 100ms", requests, inBudget, p99, wrong)
	if back == 0 {
		t.Fatalf("no decision from Redis within 20s of killing the master %s (sentinels report %s)",
			old, s.CurrentMaster(t))
	}
	t.Logf("limiting back %v after the kill (%d requests let through undecided); master %s -> %s",
		back.Round(time.Millisecond), undecided, old, s.CurrentMaster(t))
	if wrong != 0 {
		t.Errorf("%d requests not answered 200", wrong)
	}
	if inBudget != requests {
		t.Errorf("%d/%d requests within %v; max %v", inBudget, requests, budget+stall.slack(), faultPercentile(lat, 1))
	}
	// Limiting keeps working on the new master with the same client.
	for range 20 {
		if r := faultServe(h, ""); r.code != 200 || r.rateLimit == "" {
			t.Fatalf("after the failover: %d RateLimit %q", r.code, r.rateLimit)
		}
	}
}

// floodBound returns what a flood of elapsed may get through servers sharing
// lim with default options while their store fails for failing[i] at
// server i: the shared allowance, and that plus, per server, a local burst
// and the rate over its failing time and two budgets more (the calls held up
// before it, and FailLocal deciding the last failures).
func floodBound(lim store.Limit, elapsed time.Duration, failing ...time.Duration) (shared, most float64) {
	shared = float64(lim.Burst) + float64(lim.Rate)*elapsed.Seconds()
	most = shared
	for _, d := range failing {
		most += float64(lim.Burst) + float64(lim.Rate)*(d+2*middleware.DefaultTimeout).Seconds()
	}
	return shared, most
}

// fallbackSpan observes when a limiter's failure policy decided: the first and last time, and how often.
type fallbackSpan struct {
	mu          sync.Mutex
	first, last time.Time
	n, breaker  int
}

func (f *fallbackSpan) Observe(e middleware.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch e.Kind {
	case middleware.EventFallback:
		if f.n++; f.first.IsZero() {
			f.first = time.Now()
		}
		f.last = time.Now()
	case middleware.EventBreaker:
		f.breaker++
	}
}

func (f *fallbackSpan) span() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last.Sub(f.first)
}

func (f *fallbackSpan) String(start time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("%d from %v to %v (%d breaker changes)", f.n, f.first.Sub(start).Round(time.Millisecond), f.last.Sub(start).Round(time.Millisecond), f.breaker)
}

// TestFaultStallUnderFlood: two app servers with default options share one
// Redis; one client floods both from 32 goroutines for 3 s, and Redis is
// paused (SIGSTOP) for 0.2 s in the middle, longer than the budget. A stall
// must not open the gate: the client gets at most the limit's allowance over
// the run plus, per server, one burst and the rate over the time its store
// failed, the stall or longer on a loaded machine (decided locally by
// FailLocal, see floodBound); without load that ends with the stall, as the
// breaker probes again within 10 ms at first (TestBreakerBacksOff). Under
// FailOpen the same flood gets every request of that second through.
func TestFaultStallUnderFlood(t *testing.T) {
	leaktest.Check(t)
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a redis-server of its own to stop")
	}
	lim := store.Limit{Rate: 50, Period: time.Second, Burst: 10}
	prefix := fmt.Sprintf("faults:stall:%d:", time.Now().UnixNano())
	var servers []http.Handler
	spans := make([]fallbackSpan, 2)
	for i := range spans {
		rdb := singleClient(t, srv.Addr)
		servers = append(servers, faultLimiter(t, store.NewRedis(rdb, store.WithKeyPrefix(prefix)), lim,
			middleware.WithName("stall"), middleware.WithKeyFunc(mustKey(keyfuncs.Static("flooder"))),
			middleware.WithObserver(&spans[i])))
	}
	const run, pause = 3 * time.Second, 200 * time.Millisecond
	var allowed, other atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 32 {
		h := servers[g%len(servers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < run {
				switch r := faultServe(h, ""); r.code {
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
	srv.Pause()
	time.Sleep(pause)
	srv.Resume()
	paused := time.Since(p0) // longer than pause on a loaded machine
	wg.Wait()
	elapsed := time.Since(start)
	shared, most := floodBound(lim, elapsed, max(paused, spans[0].span()), max(paused, spans[1].span()))
	t.Logf("2 servers, default options, flood for %v, Redis paused %v: %d allowed; shared allowance %.0f, at most %.0f with the local fallback; fallbacks %v, %v",
		elapsed.Round(time.Millisecond), paused.Round(time.Millisecond), allowed.Load(), shared, most, spans[0].String(start), spans[1].String(start))
	if float64(allowed.Load()) > most {
		t.Errorf("%d allowed; want at most %.0f: a stall must not open the gate", allowed.Load(), most)
	}
	if other.Load() != 0 {
		t.Errorf("%d answers other than 200 and 429", other.Load())
	}
}
