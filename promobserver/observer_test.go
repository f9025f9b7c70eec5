package promobserver_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tollgate-go/tollgate/internal/race"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/promobserver"
	"github.com/tollgate-go/tollgate/store"
)

func newObserver(t testing.TB, opts ...promobserver.Option) *promobserver.Observer {
	t.Helper()
	obs, err := promobserver.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return obs
}

// The Observer is what the middleware takes.
var _ middleware.Observer = (*promobserver.Observer)(nil)
var _ prometheus.Collector = (*promobserver.Observer)(nil)

func TestScriptedSequence(t *testing.T) {
	obs := newObserver(t, promobserver.WithBuckets([]float64{0.001, 0.01}))
	errTimeout := errors.New("store: take: context deadline exceeded")
	us := time.Microsecond
	allowed := func(lim, class string, cost int, lat time.Duration) middleware.Event {
		return middleware.Event{Kind: middleware.EventAllowed, Limiter: lim, KeyClass: class, Cost: cost,
			Latency: lat, Result: store.Result{Allowed: true, Remaining: 1}}
	}
	denied := func(lim, class string, lat time.Duration) middleware.Event {
		return middleware.Event{Kind: middleware.EventDenied, Limiter: lim, KeyClass: class, Cost: 1,
			Latency: lat, Result: store.Result{RetryAfter: time.Second}}
	}
	breaker := func(lim string, from, to middleware.BreakerState) middleware.Event {
		return middleware.Event{Kind: middleware.EventBreaker, Limiter: lim, From: from, To: to}
	}
	events := []middleware.Event{
		// "api": 3 allowed, 2 denied (one by the deny cache), a store
		// timeout decided by FailOpen, a skipped request.
		allowed("api", "ip", 1, 200*us),
		allowed("api", "ip", 1, 300*us),
		allowed("api", "ip", 2, 5000*us),
		denied("api", "ip", 400*us),
		{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip", Cost: 1, Local: true},
		{Kind: middleware.EventError, Limiter: "api", KeyClass: "ip", Cost: 1, Latency: 100 * time.Millisecond, Err: errTimeout},
		{Kind: middleware.EventFallback, Limiter: "api", KeyClass: "ip", Cost: 1, Policy: middleware.FailOpen, Err: errTimeout},
		{Kind: middleware.EventSkipped, Limiter: "api"},
		// Its breaker goes round: closed → open → half-open → closed.
		breaker("api", middleware.BreakerClosed, middleware.BreakerOpen),
		breaker("api", middleware.BreakerOpen, middleware.BreakerHalfOpen),
		breaker("api", middleware.BreakerHalfOpen, middleware.BreakerClosed),
		// "shadow", in dry-run mode: one denial (not enforced), one allowed.
		{Kind: middleware.EventDenied, Limiter: "shadow", KeyClass: "user+route", Cost: 1, Latency: 1000 * us, DryRun: true},
		{Kind: middleware.EventAllowed, Limiter: "shadow", KeyClass: "user+route", Cost: 1, Latency: 1000 * us, DryRun: true},
		// "local": its breaker is open, so no store call (no latency), and
		// FailLocal decides in process.
		breaker("local", middleware.BreakerClosed, middleware.BreakerOpen),
		{Kind: middleware.EventError, Limiter: "local", KeyClass: "ip", Cost: 1, Err: middleware.ErrBreakerOpen},
		{Kind: middleware.EventFallback, Limiter: "local", KeyClass: "ip", Cost: 1, Local: true, Policy: middleware.FailLocal,
			Err: middleware.ErrBreakerOpen, Result: store.Result{Allowed: true}},
	}
	for _, e := range events {
		obs.Observe(e)
	}

	var apiAllowedSum float64 // added in the histogram's order, for an exact float
	for _, d := range []time.Duration{200 * us, 300 * us, 5000 * us} {
		apiAllowedSum += d.Seconds()
	}
	want := map[string]float64{
		`tollgate_requests_total{key_class="ip",limiter="api",outcome="allowed"}`:            3,
		`tollgate_requests_total{key_class="ip",limiter="api",outcome="denied"}`:             2,
		`tollgate_requests_total{key_class="ip",limiter="api",outcome="error"}`:              1,
		`tollgate_requests_total{key_class="ip",limiter="api",outcome="fallback"}`:           1,
		`tollgate_requests_total{key_class="none",limiter="api",outcome="skipped"}`:          1,
		`tollgate_requests_total{key_class="user+route",limiter="shadow",outcome="denied"}`:  1,
		`tollgate_requests_total{key_class="user+route",limiter="shadow",outcome="allowed"}`: 1,
		`tollgate_requests_total{key_class="ip",limiter="local",outcome="error"}`:            1,
		`tollgate_requests_total{key_class="ip",limiter="local",outcome="fallback"}`:         1,

		`tollgate_tokens_total{key_class="ip",limiter="api"}`:            4,
		`tollgate_tokens_total{key_class="user+route",limiter="shadow"}`: 1,

		`tollgate_local_decisions_total{limiter="api",outcome="denied"}`:     1,
		`tollgate_local_decisions_total{limiter="local",outcome="fallback"}`: 1,

		`tollgate_dry_run_denials_total{limiter="shadow"}`: 1,

		`tollgate_decision_seconds_bucket{limiter="api",outcome="allowed",le="0.001"}`: 2,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="allowed",le="0.01"}`:  3,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="allowed",le="+Inf"}`:  3,
		`tollgate_decision_seconds_sum{limiter="api",outcome="allowed"}`:               apiAllowedSum,
		`tollgate_decision_seconds_count{limiter="api",outcome="allowed"}`:             3,
		// The deny-cache denial took no time and is not in the histogram.
		`tollgate_decision_seconds_bucket{limiter="api",outcome="denied",le="0.001"}`: 1,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="denied",le="0.01"}`:  1,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="denied",le="+Inf"}`:  1,
		`tollgate_decision_seconds_sum{limiter="api",outcome="denied"}`:               0.0004,
		`tollgate_decision_seconds_count{limiter="api",outcome="denied"}`:             1,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="error",le="0.001"}`:  0,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="error",le="0.01"}`:   0,
		`tollgate_decision_seconds_bucket{limiter="api",outcome="error",le="+Inf"}`:   1,
		`tollgate_decision_seconds_sum{limiter="api",outcome="error"}`:                0.1,
		`tollgate_decision_seconds_count{limiter="api",outcome="error"}`:              1,
		// Upper bounds are inclusive: 1ms is in le="0.001".
		`tollgate_decision_seconds_bucket{limiter="shadow",outcome="allowed",le="0.001"}`: 1,
		`tollgate_decision_seconds_bucket{limiter="shadow",outcome="allowed",le="0.01"}`:  1,
		`tollgate_decision_seconds_bucket{limiter="shadow",outcome="allowed",le="+Inf"}`:  1,
		`tollgate_decision_seconds_sum{limiter="shadow",outcome="allowed"}`:               0.001,
		`tollgate_decision_seconds_count{limiter="shadow",outcome="allowed"}`:             1,
		`tollgate_decision_seconds_bucket{limiter="shadow",outcome="denied",le="0.001"}`:  1,
		`tollgate_decision_seconds_bucket{limiter="shadow",outcome="denied",le="0.01"}`:   1,
		`tollgate_decision_seconds_bucket{limiter="shadow",outcome="denied",le="+Inf"}`:   1,
		`tollgate_decision_seconds_sum{limiter="shadow",outcome="denied"}`:                0.001,
		`tollgate_decision_seconds_count{limiter="shadow",outcome="denied"}`:              1,

		`tollgate_breaker_transitions_total{limiter="api",to="open"}`:      1,
		`tollgate_breaker_transitions_total{limiter="api",to="half-open"}`: 1,
		`tollgate_breaker_transitions_total{limiter="api",to="closed"}`:    1,
		`tollgate_breaker_transitions_total{limiter="local",to="open"}`:    1,
		`tollgate_breaker_state{limiter="api"}`:                            0,
		`tollgate_breaker_state{limiter="local"}`:                          1,
	}
	checkSamples(t, samples(t, obs), want)

	// The gauge follows every transition: open is 1, half-open 2.
	for _, c := range []struct {
		to   middleware.BreakerState
		want float64
	}{{middleware.BreakerOpen, 1}, {middleware.BreakerHalfOpen, 2}, {middleware.BreakerClosed, 0}} {
		obs.Observe(breaker("api", 0, c.to))
		if got := samples(t, obs, "tollgate_breaker_state")[`tollgate_breaker_state{limiter="api"}`]; got != c.want {
			t.Errorf("breaker_state after a transition to %v = %v, want %v", c.to, got, c.want)
		}
	}
}

func TestIgnoredAndOddEvents(t *testing.T) {
	obs := newObserver(t)
	for _, e := range []middleware.Event{
		{Kind: 0, Limiter: "api", KeyClass: "ip"},
		{Kind: 99, Limiter: "api", KeyClass: "ip"},
		{Kind: middleware.EventBreaker, Limiter: "api", To: 7},
		{Kind: middleware.EventBreaker, Limiter: "api", To: -1},
	} {
		obs.Observe(e)
	}
	if n := testutil.CollectAndCount(obs); n != 0 {
		t.Fatalf("unknown kinds and states made %d series, want 0", n)
	}

	// A cost of 0 (a read) or below adds no tokens, and never panics (a
	// counter must not go down).
	obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 0})
	obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: -5})
	obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 3})
	got := samples(t, obs, "tollgate_tokens_total", "tollgate_requests_total")
	checkSamples(t, got, map[string]float64{
		`tollgate_requests_total{key_class="ip",limiter="api",outcome="allowed"}`: 3,
		`tollgate_tokens_total{key_class="ip",limiter="api"}`:                     3,
	})
}

func TestKeyClassLabel(t *testing.T) {
	for _, c := range []struct{ class, want string }{
		{"ip", "ip"},
		{"user+route", "user+route"},
		{"other", "other"},
		{"", "none"},
		{"IP", "other"},
		{"ip:10.0.0.1", "other"},
		{"ip4", "other"},
		{"+ip", "other"},
		{"ip+", "other"},
		{"ip++route", "other"},
		{"ip route", "other"},
		{"\xff", "other"},
		{"é", "other"},
		{strings.Repeat("a", 32), strings.Repeat("a", 32)},
		{strings.Repeat("a", 33), "other"},
	} {
		t.Run(fmt.Sprintf("%q", c.class), func(t *testing.T) {
			obs := newObserver(t)
			obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: c.class})
			got := labelValues(samples(t, obs, "tollgate_requests_total"), "key_class")
			if len(got) != 1 || !got[c.want] {
				t.Errorf("key_class of %q = %v, want %q", c.class, got, c.want)
			}
		})
	}
}

func TestLimiterLabel(t *testing.T) {
	obs := newObserver(t, promobserver.WithMaxLimiters(2))
	for _, name := range []string{"a", "b", "c", "a", "", "\xff", strings.Repeat("x", 129), "b", "d"} {
		obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: name, KeyClass: "ip"})
	}
	obs.Observe(middleware.Event{Kind: middleware.EventBreaker, Limiter: "z", To: middleware.BreakerOpen})
	checkSamples(t, samples(t, obs, "tollgate_requests_total", "tollgate_breaker_state"), map[string]float64{
		`tollgate_requests_total{key_class="ip",limiter="a",outcome="allowed"}`:     2,
		`tollgate_requests_total{key_class="ip",limiter="b",outcome="allowed"}`:     2,
		`tollgate_requests_total{key_class="ip",limiter="other",outcome="allowed"}`: 5,
		`tollgate_breaker_state{limiter="other"}`:                                   1,
	})
}

func TestOptions(t *testing.T) {
	obs := newObserver(t, promobserver.WithNamespace("shop"),
		promobserver.WithConstLabels(prometheus.Labels{"service": "checkout"}), nil)
	obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 1})
	checkSamples(t, samples(t, obs, "shop_requests_total", "shop_tokens_total"), map[string]float64{
		`shop_requests_total{key_class="ip",limiter="api",outcome="allowed",service="checkout"}`: 1,
		`shop_tokens_total{key_class="ip",limiter="api",service="checkout"}`:                     1,
	})

	obs = newObserver(t, promobserver.WithNamespace(""))
	obs.Observe(middleware.Event{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip"})
	if n := testutil.CollectAndCount(obs, "requests_total"); n != 1 {
		t.Errorf("without a namespace: %d series of requests_total, want 1", n)
	}
}

func TestNewErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  promobserver.Option
		want string
	}{
		{"namespace with a dash", promobserver.WithNamespace("my-app"), "WithNamespace"},
		{"namespace with a leading digit", promobserver.WithNamespace("1app"), "WithNamespace"},
		{"const label reserved", promobserver.WithConstLabels(prometheus.Labels{"__x": "1"}), "WithConstLabels"},
		{"const label invalid", promobserver.WithConstLabels(prometheus.Labels{"a-b": "1"}), "WithConstLabels"},
		{"const label clash", promobserver.WithConstLabels(prometheus.Labels{"limiter": "1"}), "WithConstLabels"},
		{"const label value not UTF-8", promobserver.WithConstLabels(prometheus.Labels{"a": "\xff"}), "WithConstLabels"},
		{"no buckets", promobserver.WithBuckets(nil), "WithBuckets"},
		{"decreasing buckets", promobserver.WithBuckets([]float64{0.1, 0.01}), "WithBuckets"},
		{"equal buckets", promobserver.WithBuckets([]float64{0.1, 0.1}), "WithBuckets"},
		{"negative bucket", promobserver.WithBuckets([]float64{-1, 1}), "WithBuckets"},
		{"zero limiters", promobserver.WithMaxLimiters(0), "WithMaxLimiters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			obs, err := promobserver.New(c.opt)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "promobserver: ") {
				t.Fatalf("New: got %v, %v; want an error naming %s", obs, err, c.want)
			}
		})
	}
}

func TestLint(t *testing.T) {
	obs := newObserver(t)
	for k := middleware.EventAllowed; k <= middleware.EventSkipped; k++ {
		obs.Observe(middleware.Event{Kind: k, Limiter: "api", KeyClass: "ip", Cost: 1, Latency: time.Millisecond,
			Local: true, DryRun: true, To: middleware.BreakerOpen})
	}
	// requests, local: 5 outcomes each; decision_seconds: 3; the others 1.
	if n := testutil.CollectAndCount(obs); n != 17 {
		t.Errorf("%d series, want 17", n)
	}
	problems, err := testutil.CollectAndLint(obs)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// The label set stays bounded however many keys, key classes and limiter
// names the events carry.
func TestBoundedLabels(t *testing.T) {
	const events = 100_000
	kinds := []middleware.EventKind{middleware.EventAllowed, middleware.EventDenied, middleware.EventError,
		middleware.EventFallback, middleware.EventSkipped}
	subject := func(i int) string { // 100,000 distinct client addresses
		return fmt.Sprintf("ip:10.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff)
	}
	garbage := func(i int) string { // every fourth looks like a class, the rest do not
		switch i % 4 {
		case 0:
			return "k" + strings.Map(func(r rune) rune { return 'a' + (r-'0')%26 }, fmt.Sprint(i)) // ka, kb, …: valid
		case 1:
			return subject(i) // a raw key where a class should be
		case 2:
			return fmt.Sprintf("class%d", i)
		}
		return strings.Repeat("z", 33+i%100)
	}

	t.Run("distinct subjects", func(t *testing.T) {
		obs := newObserver(t)
		for i := range events {
			obs.Observe(middleware.Event{Kind: kinds[i%len(kinds)], Limiter: "api",
				KeyClass: middleware.KeyClass(subject(i)), Cost: 1, Latency: time.Millisecond})
		}
		s := samples(t, obs)
		for name, want := range map[string]int{
			"tollgate_requests_total":   5, // one key class, 5 outcomes
			"tollgate_tokens_total":     1,
			"tollgate_decision_seconds": 3, // allowed, denied, error
		} {
			if n := testutil.CollectAndCount(obs, name); n != want {
				t.Errorf("%s: %d series, want %d", name, n, want)
			}
		}
		if got := sum(s, "tollgate_requests_total"); got != events {
			t.Errorf("requests_total adds up to %v, want %d", got, events)
		}
		t.Logf("%d events, %d distinct subjects: %d series in all", events, events, testutil.CollectAndCount(obs))
	})

	t.Run("garbage key classes", func(t *testing.T) {
		obs := newObserver(t)
		for i := range events {
			obs.Observe(middleware.Event{Kind: kinds[i%len(kinds)], Limiter: "api", KeyClass: garbage(i)})
		}
		s := samples(t, obs, "tollgate_requests_total")
		classes := labelValues(s, "key_class")
		if len(classes) != 33 || !classes["other"] { // the first 32 valid ones, and "other"
			t.Errorf("%d key_class values, want 33 with other: %v", len(classes), sortedKeys(classes))
		}
		if n := testutil.CollectAndCount(obs, "tollgate_requests_total"); n > 34*5 {
			t.Errorf("requests_total: %d series, want at most %d", n, 34*5)
		}
		if got := sum(s, "tollgate_requests_total"); got != events {
			t.Errorf("requests_total adds up to %v, want %d", got, events)
		}
		t.Logf("%d events with garbage key classes: %d requests_total series, %d in all",
			events, testutil.CollectAndCount(obs, "tollgate_requests_total"), testutil.CollectAndCount(obs))
	})

	t.Run("everything at once", func(t *testing.T) {
		obs := newObserver(t)
		for i := range events {
			class := middleware.KeyClass(subject(i))
			if i%10 == 0 {
				class = garbage(i / 10)
			}
			obs.Observe(middleware.Event{Kind: kinds[i%len(kinds)], Limiter: fmt.Sprintf("tenant-%d", i%1000),
				KeyClass: class, Cost: 1, Latency: time.Millisecond, Local: i%7 == 0, DryRun: i%11 == 0})
			if i%1000 == 0 {
				obs.Observe(middleware.Event{Kind: middleware.EventBreaker, Limiter: fmt.Sprintf("tenant-%d", i),
					To: middleware.BreakerOpen})
			}
		}
		s := samples(t, obs)
		limiters := labelValues(s, "limiter")
		if len(limiters) != promobserver.DefaultMaxLimiters+1 || !limiters["other"] {
			t.Errorf("%d limiter values, want %d with other", len(limiters), promobserver.DefaultMaxLimiters+1)
		}
		if classes := labelValues(s, "key_class"); len(classes) > 34 {
			t.Errorf("%d key_class values, want at most 34", len(classes))
		}
		total := testutil.CollectAndCount(obs)
		requests := testutil.CollectAndCount(obs, "tollgate_requests_total")
		const bound = (promobserver.DefaultMaxLimiters + 1) * 34 * 5
		if requests > bound {
			t.Errorf("requests_total: %d series, want at most %d", requests, bound)
		}
		if got := sum(s, "tollgate_requests_total"); got != events {
			t.Errorf("requests_total adds up to %v, want %d", got, events)
		}
		if got := sum(s, "tollgate_requests_total", `limiter="other"`); got != events*9/10 {
			t.Errorf("limiter=other counted %v events, want %d (900 of 1,000 names)", got, events*9/10)
		}
		t.Logf("%d events, %d subjects, 1,000 limiter names, garbage key classes: %d limiter and %d key_class values, %d requests_total series (bound %d), %d series in all",
			events, events, len(limiters), len(labelValues(s, "key_class")), requests, bound, total)
	})
}

// Many goroutines observe at once, some of them the first events of their
// series, while others scrape: nothing is lost (run with -race).
func TestConcurrent(t *testing.T) {
	obs := newObserver(t)
	const goroutines, perG = 8, 4_500 // perG divides by 150 names, 5 kinds, 6 classes
	kinds := []middleware.EventKind{middleware.EventAllowed, middleware.EventDenied, middleware.EventError,
		middleware.EventFallback, middleware.EventSkipped}
	classes := []string{"ip", "user", "user+route", "key", "", "bad:class"}
	stop := make(chan struct{})
	var scrapes sync.WaitGroup
	scrapes.Add(1)
	go func() {
		defer scrapes.Done()
		for {
			select {
			case <-stop:
				return
			default:
				testutil.CollectAndCount(obs)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				obs.Observe(middleware.Event{Kind: kinds[i%len(kinds)], Limiter: fmt.Sprintf("lim-%d", i%150),
					KeyClass: classes[(i+g)%len(classes)], Cost: 2, Latency: time.Millisecond, Local: i%3 == 0})
				if i%500 == 0 {
					obs.Observe(middleware.Event{Kind: middleware.EventBreaker, Limiter: "lim-0", To: middleware.BreakerOpen})
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	scrapes.Wait()

	s := samples(t, obs)
	const total = goroutines * perG
	for _, c := range []struct {
		metric string
		match  []string
		want   float64
	}{
		{"tollgate_requests_total", nil, total},
		{"tollgate_requests_total", []string{`outcome="allowed"`}, total / 5},
		{"tollgate_requests_total", []string{`key_class="other"`}, total / 6},
		{"tollgate_requests_total", []string{`key_class="none"`}, total / 6},
		{"tollgate_requests_total", []string{`limiter="other"`}, goroutines * 50 * perG / 150},
		{"tollgate_tokens_total", nil, 2 * total / 5},
		{"tollgate_decision_seconds_count", nil, 3 * total / 5},
		{"tollgate_breaker_transitions_total", nil, goroutines * perG / 500},
	} {
		if got := sum(s, c.metric, c.match...); got != c.want {
			t.Errorf("%s%v adds up to %v, want %v", c.metric, c.match, got, c.want)
		}
	}
	if got, want := sum(s, "tollgate_local_decisions_total"), float64(goroutines*perG/3); got != want {
		t.Errorf("local_decisions_total adds up to %v, want %v", got, want)
	}
}

func TestObserveAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	obs := newObserver(t, promobserver.WithMaxLimiters(1))
	obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip"}) // takes the one limiter label
	for _, c := range []struct {
		name string
		e    middleware.Event
	}{
		{"allowed", middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 1, Latency: time.Millisecond}},
		{"denied local", middleware.Event{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "user+route", Cost: 1, Local: true}},
		{"denied dry run", middleware.Event{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip", Cost: 1, DryRun: true}},
		{"skipped", middleware.Event{Kind: middleware.EventSkipped, Limiter: "api"}},
		{"limiter past the bound", middleware.Event{Kind: middleware.EventAllowed, Limiter: "tenant-7", KeyClass: "ip", Cost: 1}},
		{"garbage key class", middleware.Event{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip:10.0.0.1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			obs.Observe(c.e) // the first event of a series resolves it
			if n := testing.AllocsPerRun(1000, func() { obs.Observe(c.e) }); n != 0 {
				t.Errorf("Observe: %v allocations, want 0", n)
			}
		})
	}
	// Through the interface, as the middleware calls it.
	var o middleware.Observer = obs
	e := middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 1, Latency: time.Millisecond}
	if n := testing.AllocsPerRun(1000, func() { o.Observe(e) }); n != 0 {
		t.Errorf("Observe through middleware.Observer: %v allocations, want 0", n)
	}
}
