package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// penaltyStore is a store for the penalty tests, with a way to move its
// clock (sleep, on a real server) and to read a key's PTTL (-1s: no TTL
// to read, on Memory).
type penaltyStore struct {
	s       store.Store
	advance func(time.Duration)
	pttl    func(key string) time.Duration
	real    bool // the real clock: advance sleeps
}

func penaltyStores(t *testing.T, f func(t *testing.T, ps penaltyStore)) {
	t.Run("memory", func(t *testing.T) {
		now := time.Unix(1_700_000_000, 0)
		m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
		f(t, penaltyStore{m, func(d time.Duration) { now = now.Add(d) }, func(string) time.Duration { return -time.Second }, false})
	})
	redisPTTL := func(c *redis.Client, r *store.Redis) func(string) time.Duration {
		return func(key string) time.Duration { return c.PTTL(context.Background(), r.Key(key)).Val() }
	}
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		now := time.Unix(1_700_000_000, 0)
		mr.SetTime(now)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		r := store.NewRedis(c)
		f(t, penaltyStore{r, func(d time.Duration) { now = now.Add(d); mr.SetTime(now); mr.FastForward(d) }, redisPTTL(c, r), false})
	})
	t.Run("redis", func(t *testing.T) {
		c := redistest.Server(t).Client(t)
		r := store.NewRedis(c, store.WithKeyPrefix(t.Name()+":"))
		f(t, penaltyStore{r, time.Sleep, redisPTTL(c, r), true})
	})
}

// 5 failed logins within a minute block the client for 15 minutes, on
// every store: the next request, with the right password, gets a 429 whose
// Retry-After is the block's time left and counts down; refusals during the
// block do not extend it; the block lives in the key's TTL and ends with it.
func TestPenaltyBlocksFailedLogins(t *testing.T) {
	penaltyStores(t, func(t *testing.T, ps penaltyStore) {
		lim := store.Limit{Rate: 5, Period: time.Minute, Burst: 5}
		const block = 15 * time.Minute
		l := mustNew(t, ps.s, lim, middleware.WithName("login"), quiet, patient,
			middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-User"))),
			middleware.WithRefund(func(r *http.Request, status int) bool { return status < 400 }),
			middleware.WithPenalty(middleware.Penalty{Strikes: 5, Within: time.Minute, Block: block,
				Failed: func(r *http.Request, status int) bool { return status == http.StatusUnauthorized }}))
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Password") != "right" {
				w.WriteHeader(http.StatusUnauthorized)
			}
		}))
		login := func(password string) (int, time.Duration) {
			r := httptest.NewRequest(http.MethodPost, "/login", nil)
			r.Header.Set("X-User", "alice")
			r.Header.Set("X-Password", password)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			secs, _ := strconv.Atoi(w.Header().Get("Retry-After"))
			return w.Code, time.Duration(secs) * time.Second
		}
		for i := range 3 { // successes are refunded: no strikes, no tokens
			if code, _ := login("right"); code != http.StatusOK {
				t.Fatalf("good login %d: %d, want 200", i+1, code)
			}
		}
		for i := range 5 {
			if code, _ := login("wrong"); code != http.StatusUnauthorized {
				t.Fatalf("failed login %d: %d, want 401", i+1, code)
			}
		}
		code, retry := login("right")
		// Block adds the 15 minutes to the bucket's debt (a minute, its five
		// tokens), and the request waits for one token more.
		if code != http.StatusTooManyRequests || retry < block || retry > block+time.Minute+13*time.Second {
			t.Fatalf("after 5 failures: %d, Retry-After %v; want 429, about %v", code, retry, block)
		}
		key := ps.pttl(l.StoreKey(mustSubject(t, "alice")))
		if key != -time.Second && (key < block || key > block+2*time.Minute) {
			t.Errorf("PTTL of the blocked bucket %v, want the block and the bucket's refill", key)
		}
		step := time.Minute
		if ps.real {
			step = 1100 * time.Millisecond
		}
		ps.advance(step)
		for range 10 { // refused during the block: no strikes, no longer block
			if code, _ := login("wrong"); code != http.StatusTooManyRequests {
				t.Fatalf("during the block: %d, want 429", code)
			}
		}
		code, later := login("right")
		if code != http.StatusTooManyRequests || later > retry-step.Truncate(time.Second) || later < retry-step-time.Second {
			t.Fatalf("%v later: %d, Retry-After %v; want 429 and %v less than %v", step, code, later, step, retry)
		}
		t.Logf("blocked: Retry-After %v, PTTL %v; %v and 10 refusals later, Retry-After %v", retry, key, step, later)
		if ps.real {
			return // the rest needs a controlled clock
		}
		ps.advance(retry)
		if code, _ := login("right"); code != http.StatusOK {
			t.Fatalf("after the block: %d, want 200", code)
		}
		for i := range 4 { // the strikes were forgiven with the block
			if code, _ := login("wrong"); code != http.StatusUnauthorized {
				t.Fatalf("failed login %d after the block: %d, want 401", i+1, code)
			}
		}
		if code, _ := login("right"); code != http.StatusOK {
			t.Fatalf("4 failures after the block: %d, want 200", code)
		}
	})
}

func mustSubject(t *testing.T, user string) string {
	t.Helper()
	kf := mustKey(keyfuncs.Header("X-User"))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-User", user)
	s, err := kf(r)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Without Failed, refusals are the strikes: the third 429 within a minute
// blocks the client for 10 minutes, with and without the deny cache; in
// dry-run mode nothing is blocked.
func TestPenaltyCountsRefusals(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      []middleware.Option
		wantBlock bool
	}{
		{"store", nil, true},
		{"deny cache", []middleware.Option{middleware.WithDenyCache(100)}, true},
		{"dry run", []middleware.Option{middleware.WithDryRun(true)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
			lim := store.Limit{Rate: 1, Period: time.Minute, Burst: 1}
			opts := append([]middleware.Option{middleware.WithName("api"), quiet,
				middleware.WithPenalty(middleware.Penalty{Strikes: 3, Within: time.Minute, Block: 10 * time.Minute})}, tc.opts...)
			h := mustNew(t, m, lim, opts...).Handler(okHandler)
			var last *httptest.ResponseRecorder
			for range 5 {
				last = httptest.NewRecorder()
				h.ServeHTTP(last, httptest.NewRequest(http.MethodGet, "/", nil))
			}
			res, err := store.Inspect(context.Background(), m, "api:ip:192.0.2.1", lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if blocked := res.RetryAfter >= 10*time.Minute; blocked != tc.wantBlock {
				t.Fatalf("after 1 allowed and 4 refused: bucket %+v, blocked %v, want %v", res, blocked, tc.wantBlock)
			}
			if !tc.wantBlock {
				return
			}
			if ra, _ := strconv.Atoi(last.Header().Get("Retry-After")); last.Code != http.StatusTooManyRequests || ra < 600 {
				t.Errorf("a request in the block: %d, Retry-After %ds; want 429, at least 600", last.Code, ra)
			}
		})
	}
}

func TestPenaltyConfig(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	for _, p := range []middleware.Penalty{{}, {Strikes: 1, Within: time.Minute}, {Strikes: 1, Within: time.Nanosecond, Block: time.Second}} {
		if _, err := middleware.New(m, store.PerSecond(1), middleware.WithPenalty(p)); err == nil {
			t.Errorf("WithPenalty(%+v): no error", p)
		}
	}
	if _, err := middleware.New(m, store.PerSecond(1), middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: 100 * 365 * 24 * time.Hour})); err == nil {
		t.Error("a block the bucket cannot hold: no error")
	}
	type plain struct{ store.Store }
	if _, err := middleware.New(plain{m}, store.PerSecond(1), middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: time.Minute})); err == nil {
		t.Error("a store that cannot block: no error")
	}
}

// A Multi's penalty blocks every policy's bucket of the subject, on Redis
// in one hash-tagged group, so that none of them lets the client through.
func TestPenaltyMulti(t *testing.T) {
	penaltyStores(t, func(t *testing.T, ps penaltyStore) {
		perUser := store.Limit{Rate: 1, Period: time.Minute, Burst: 1}
		perHour := store.Limit{Rate: 100, Period: time.Hour, Burst: 100}
		l, err := middleware.NewMulti(ps.s, []middleware.Policy{{Name: "minute", Limit: perUser}, {Name: "hour", Limit: perHour}},
			middleware.WithName("multi"), quiet, patient,
			middleware.WithPenalty(middleware.Penalty{Strikes: 2, Within: time.Minute, Block: 5 * time.Minute}))
		if err != nil {
			t.Fatal(err)
		}
		h := l.Handler(okHandler)
		codes := []int{}
		var retry int
		for range 4 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			codes = append(codes, w.Code)
			retry, _ = strconv.Atoi(w.Header().Get("Retry-After"))
		}
		if codes[0] != 200 || codes[1] != 429 || codes[2] != 429 || codes[3] != 429 || retry < 300 {
			t.Fatalf("codes %v, last Retry-After %ds; want 200 then 429s, blocked at least 300s", codes, retry)
		}
		for _, lim := range []store.Limit{perUser, perHour} {
			name := map[store.Limit]string{perUser: "minute", perHour: "hour"}[lim]
			res, err := store.Inspect(context.Background(), ps.s, name+":{ip:192.0.2.1}", lim, 1)
			if err != nil || res.RetryAfter < 5*time.Minute {
				t.Errorf("policy %s after the block: %+v, %v; want blocked for 5 minutes", name, res, err)
			}
		}
	})
}

// slowStore answers its limiter's decisions 10 ms after making them, so
// that many refusals are in flight when a block lands.
type slowStore struct{ *store.Memory }

func (s slowStore) Take(ctx context.Context, key string, limit store.Limit, cost int) (store.Result, error) {
	res, err := s.Memory.Take(ctx, key, limit, cost)
	if key[0] != '}' && cost > 0 { // a decision, not a strike or a read: its answer comes back late
		time.Sleep(10 * time.Millisecond)
	}
	return res, err
}

// 64 goroutines flooding one key on the real clock block it once: the
// refusals in flight when the block lands, which strike again, find it
// blocked and do not lengthen it.
func TestPenaltyUnderFlood(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 5}
	const block = 10 * time.Minute
	h := mustNew(t, slowStore{m}, lim, middleware.WithName("flood"), quiet,
		middleware.WithPenalty(middleware.Penalty{Strikes: 5, Within: time.Second, Block: block})).Handler(okHandler)
	var wg sync.WaitGroup
	var served atomic.Int64
	deadline := time.Now().Add(300 * time.Millisecond)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
				if w.Code == http.StatusOK {
					served.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res, err := store.Inspect(context.Background(), m, "flood:ip:192.0.2.1", lim, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Blocked once: the block on top of at most the bucket's debt (500 ms)
	// and a token (100 ms), less the time since.
	t.Logf("RetryAfter %v, %d served", res.RetryAfter, served.Load())
	if res.RetryAfter < block-time.Second || res.RetryAfter > block+600*time.Millisecond {
		t.Fatalf("after the flood: RetryAfter %v, want about %v (one block); %d served", res.RetryAfter, block, served.Load())
	}
	if n := served.Load(); n > 5+3+1 { // the burst and the rate over 300 ms, before the block
		t.Errorf("%d served, want at most 9", n)
	}
}

// A block shorter than a bucket's refill is a block too: refusals during it,
// and failing requests of cost 0, which a block lets through, do not strike.
func TestPenaltyShortBlockNotExtended(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
	lim := store.Limit{Rate: 100, Period: time.Minute, Burst: 100}
	var cost int
	h := mustNew(t, m, lim, middleware.WithName("short"), quiet,
		middleware.WithCost(func(*http.Request) int { return cost }),
		middleware.WithPenalty(middleware.Penalty{Strikes: 2, Within: time.Minute, Block: 30 * time.Second,
			Failed: func(r *http.Request, status int) bool { return status == http.StatusUnauthorized }})).
		Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	serve := func(c int) int {
		cost = c
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		return w.Code
	}
	inspect := func() time.Duration {
		res, err := store.Inspect(context.Background(), m, "short:ip:192.0.2.1", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.ResetAfter
	}
	serve(100) // a 401: the first strike, and the bucket is empty
	if code := serve(1); code != http.StatusTooManyRequests {
		t.Fatalf("the second request: %d, want 429", code)
	}
	blocked := inspect() // the strike that blocked: a minute of debt, plus cap and block
	if blocked < 2*time.Minute+30*time.Second {
		t.Fatalf("blocked: ResetAfter %v, want at least 2m30s", blocked)
	}
	now = now.Add(40 * time.Second) // the block is over, the bucket not yet refilled
	for range 3 {
		serve(1)
		serve(0) // allowed through the block: a 401 of cost 0
	}
	if got := inspect(); got != blocked-40*time.Second {
		t.Errorf("40 s later, after refusals and failures: ResetAfter %v, want %v (not blocked again)", got, blocked-40*time.Second)
	}
}

// The 429 that lands a Multi's block reports the block: its Retry-After is
// the longest wait once every policy is blocked, not the wait before.
func TestPenaltyMultiReportsTheBlock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
	var got store.Result
	l, err := middleware.NewMulti(m, []middleware.Policy{
		{Name: "fast", Limit: store.Limit{Rate: 10, Period: time.Second, Burst: 1}},
		{Name: "slow", Limit: store.Limit{Rate: 1, Period: time.Hour, Burst: 5}},
	}, middleware.WithName("mb"), quiet, middleware.WithHeaders(0),
		middleware.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res store.Result) {
			got = res
			w.WriteHeader(http.StatusTooManyRequests)
		}),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(okHandler)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil)) // refused by fast: the strike that blocks
	// slow: an hour of debt, plus its cap (5 h) and the minute; a token more, less the cap.
	want := 2*time.Hour + time.Minute
	if ra, _ := strconv.Atoi(w.Header().Get("Retry-After")); w.Code != http.StatusTooManyRequests || ra < int(want.Seconds()) || got.RetryAfter < want {
		t.Fatalf("the blocking 429: %d, Retry-After %ds, denied handler's result %+v; want the block of slow, %v", w.Code, ra, got, want)
	}
}

// On a Multi with a global policy, a client's penalty blocks its own
// buckets and never the global one, and a refusal by the global limit is
// no strike against the client; on a Cluster the buckets are in two slots.
func TestPenaltyLeavesGlobalPolicies(t *testing.T) {
	multiStores(t, func(t *testing.T, s store.Store) {
		l, err := middleware.NewMulti(s, []middleware.Policy{
			{Name: "user", Limit: store.Limit{Rate: 1, Period: time.Minute, Burst: 1}},
			{Name: "all", Limit: store.Limit{Rate: 3, Period: time.Hour, Burst: 3}, Key: mustKey(keyfuncs.Static("all"))},
		}, middleware.WithName("global"), quiet, patient, middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-User"))),
			middleware.WithPenalty(middleware.Penalty{Strikes: 2, Within: time.Minute, Block: 10 * time.Minute}))
		if err != nil {
			t.Fatal(err)
		}
		h := l.Handler(okHandler)
		get := func(user string) (int, int) {
			w := serveUser(h, user)
			ra, _ := strconv.Atoi(w.Header().Get("Retry-After"))
			return w.Code, ra
		}
		if code, _ := get("mallory"); code != 200 {
			t.Fatalf("mallory's first request: %d", code)
		}
		get("mallory")
		if code, ra := get("mallory"); code != 429 || ra < 600 { // the second strike
			t.Fatalf("mallory's third request: %d, Retry-After %d; want 429, blocked 10 minutes", code, ra)
		}
		if code, _ := get("alice"); code != 200 {
			t.Fatalf("alice after mallory's block: %d, want 200 (the global bucket is not blocked)", code)
		}
		if code, _ := get("bob"); code != 200 {
			t.Fatalf("bob: %d, want 200", code)
		}
		for range 3 { // the global limit (3 an hour) is spent: carol is refused, but not her fault
			if code, _ := get("carol"); code != 429 {
				t.Fatalf("carol under the spent global limit: %d, want 429", code)
			}
		}
		carol, err := store.Inspect(context.Background(), s, "user:{"+mustSubject(t, "carol")+"}", store.Limit{Rate: 1, Period: time.Minute, Burst: 1}, 1)
		if err != nil || !carol.Allowed || carol.ResetAfter != 0 {
			t.Errorf("carol's own bucket after 3 refusals by the global limit: %+v, %v; want full, not blocked", carol, err)
		}
	})
}

// A handler that panics is settled as the 500 a Recoverer before the limiter writes (WithRefund
// of 5xx gives its tokens back), and the panic goes on; one aborted with http.ErrAbortHandler,
// which answers nothing, is not.
func TestRefundAfterPanic(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.Limit{Rate: 1, Period: time.Minute, Burst: 3}
	l := mustNew(t, m, lim, middleware.WithKeyFunc(mustKey(keyfuncs.Static("k"))),
		middleware.WithRefund(func(r *http.Request, status int) bool { return status >= 500 }))
	for _, tc := range []struct {
		panic any
		left  int
	}{{"bug", 3}, {http.ErrAbortHandler, 2}} {
		h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(tc.panic) }))
		func() {
			defer func() {
				if v := recover(); v != tc.panic {
					t.Errorf("recovered %v; want the handler's panic %v", v, tc.panic)
				}
			}()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
		}()
		res, err := store.Inspect(context.Background(), m, l.StoreKey("k"), lim, 0)
		if err != nil || res.Remaining != tc.left {
			t.Errorf("after a panic %v: %d left, %v; want %d", tc.panic, res.Remaining, err, tc.left)
		}
	}
}
