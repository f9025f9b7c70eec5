package promobserver_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/promobserver"
	"github.com/tollgate-go/tollgate/store"
)

// serve starts a server with h at / and the metrics of reg at /metrics.
func serve(t *testing.T, h http.Handler, reg *prometheus.Registry) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// get returns the status and body of a GET of url.
func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })

// A real limiter on the Memory store reports to the Observer, whose
// metrics a real scrape of /metrics shows.
func TestEndToEnd(t *testing.T) {
	obs := newObserver(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	lim, err := middleware.New(st, store.PerSecond(2), middleware.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, lim.Handler(ok), reg)

	// A burst of 2, then a token every 500ms: 5 quick requests from one
	// address are 2 allowed and 3 refused, unless the machine took over
	// 500ms for them.
	start := time.Now()
	codes := make(map[int]int)
	for range 5 {
		code, _ := get(t, srv.Client(), srv.URL+"/")
		codes[code]++
	}
	if time.Since(start) < 500*time.Millisecond && (codes[http.StatusNoContent] != 2 || codes[http.StatusTooManyRequests] != 3) {
		t.Fatalf("responses %v, want 2 × 204 and 3 × 429", codes)
	}
	if codes[http.StatusNoContent]+codes[http.StatusTooManyRequests] != 5 {
		t.Fatalf("responses %v, want only 204 and 429", codes)
	}

	_, text := get(t, srv.Client(), srv.URL+"/metrics")
	got := parseSamples(t, text)
	allowed, denied := float64(codes[http.StatusNoContent]), float64(codes[http.StatusTooManyRequests])
	n := lim.Name() // the default: 2-per-1s@<where New was called>
	for name, want := range map[string]float64{
		`tollgate_requests_total{key_class="ip",limiter="` + n + `",outcome="allowed"}`: allowed,
		`tollgate_requests_total{key_class="ip",limiter="` + n + `",outcome="denied"}`:  denied,
		`tollgate_tokens_total{key_class="ip",limiter="` + n + `"}`:                     allowed,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	if n := sum(got, "tollgate_requests_total"); n != 5 {
		t.Errorf("requests_total adds up to %v, want 5\n%s", n, text)
	}
	if n := sum(got, "tollgate_decision_seconds_count"); n > 5 {
		t.Errorf("decision_seconds counts %v decisions, want at most 5", n)
	}
}

// failingStore fails every decision, as a Redis that is down.
type failingStore struct{}

func (failingStore) Take(context.Context, string, store.Limit, int) (store.Result, error) {
	return store.Result{}, errors.New("connection refused")
}

// A store that is down: every request is served by FailOpen, and the
// breaker opens after 2 failures.
func TestEndToEndStoreDown(t *testing.T) {
	obs := newObserver(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	lim, err := middleware.New(failingStore{}, store.PerSecond(2), middleware.WithName("down"),
		middleware.WithBreaker(2, time.Hour), middleware.WithObserver(obs), middleware.WithFailurePolicy(middleware.FailOpen))
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, lim.Handler(ok), reg)
	for i := range 4 {
		if code, _ := get(t, srv.Client(), srv.URL+"/"); code != http.StatusNoContent {
			t.Fatalf("request %d: status %d, want 204 (FailOpen)", i, code)
		}
	}

	_, text := get(t, srv.Client(), srv.URL+"/metrics")
	got := parseSamples(t, text)
	if n := sum(got, "tollgate_requests_total", `limiter="down"`, `outcome="fallback"`); n != 4 {
		t.Errorf("fallback events: %v, want 4\n%s", n, text)
	}
	if n := sum(got, "tollgate_requests_total", `limiter="down"`, `outcome="error"`); n < 2 {
		t.Errorf("error events: %v, want at least the 2 store failures\n%s", n, text)
	}
	for name, want := range map[string]float64{
		`tollgate_breaker_transitions_total{limiter="down",to="open"}`: 1,
		`tollgate_breaker_state{limiter="down"}`:                       1, // open
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v\n%s", name, got[name], want, text)
		}
	}
}

// Example wiring: one Observer for every limiter of a server.
func Example_limiter() {
	obs, err := promobserver.New()
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)

	st := store.NewMemory()
	defer st.Close()
	api, err := middleware.New(st, store.PerMinute(100), middleware.WithName("api"), middleware.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", api.Handler(ok))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	_ = mux // http.ListenAndServe(":8080", mux)
}
