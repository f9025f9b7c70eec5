package otelobserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/otelobserver"
	"github.com/tollgate-go/tollgate/store"
)

func newObserver(t *testing.T) (*otelobserver.Observer, *sdkmetric.ManualReader) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { provider.Shutdown(context.Background()) })
	obs, err := otelobserver.New(provider.Meter("tollgate"))
	if err != nil {
		t.Fatal(err)
	}
	return obs, reader
}

// sums returns a counter's points by their attributes, as "k=v,k=v".
func sums(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]int64 {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					out[attrs(dp.Attributes)] += dp.Value
				}
			}
		}
	}
	return out
}

func attrs(s attribute.Set) string {
	var out string
	for _, kv := range s.ToSlice() {
		if out != "" {
			out += ","
		}
		out += string(kv.Key) + "=" + kv.Value.Emit()
	}
	return out
}

// A limiter's requests through the middleware: 5 allowed and 3 denied,
// counted by outcome with the key's class, the tokens of the allowed ones.
func TestThroughTheMiddleware(t *testing.T) {
	obs, reader := newObserver(t)
	m := store.NewMemory()
	defer m.Close()
	l, err := middleware.New(m, store.PerMinute(5), middleware.WithName("api"), middleware.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 8 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}
	got := sums(t, reader, "tollgate.requests")
	if got["key_class=ip,limiter=api,outcome=allowed"] != 5 || got["key_class=ip,limiter=api,outcome=denied"] != 3 {
		t.Errorf("tollgate.requests = %v; want 5 allowed and 3 denied for limiter api, key class ip", got)
	}
	if tok := sums(t, reader, "tollgate.tokens"); tok["key_class=ip,limiter=api"] != 5 {
		t.Errorf("tollgate.tokens = %v; want 5", tok)
	}
}

// Attributes stay bounded: 1,000 limiter names and 1,000 key classes make
// at most 101 and 33 values; the raw key never appears.
func TestBoundedAttributes(t *testing.T) {
	obs, reader := newObserver(t)
	for i := range 1000 {
		n := strconv.Itoa(i)
		obs.Observe(middleware.Event{Kind: middleware.EventDenied, Limiter: "lim" + n, Key: "ip:10.0.0." + n, KeyClass: "class" + n})
	}
	obs.Observe(middleware.Event{Kind: middleware.EventBreaker, Limiter: "lim0", From: middleware.BreakerClosed, To: middleware.BreakerOpen})
	limiters, classes := map[string]bool{}, map[string]bool{}
	for k := range sums(t, reader, "tollgate.requests") {
		for _, kv := range strings.Split(k, ",") {
			name, v, _ := strings.Cut(kv, "=")
			switch name {
			case "limiter":
				limiters[v] = true
			case "key_class":
				classes[v] = true
			}
		}
	}
	if len(limiters) > 101 || !limiters["other"] || len(classes) > 33 || !classes["other"] {
		t.Errorf("%d limiter values, %d key classes; want at most 101 and 33, with other", len(limiters), len(classes))
	}
	if tr := sums(t, reader, "tollgate.breaker.transitions"); tr["limiter=lim0,to=open"] != 1 {
		t.Errorf("tollgate.breaker.transitions = %v; want one to open", tr)
	}
}
