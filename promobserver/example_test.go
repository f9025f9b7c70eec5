package promobserver_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/promobserver"
)

func ExampleNew() {
	obs, err := promobserver.New() // promobserver.WithConstLabels(prometheus.Labels{"service": "shop"}), ...
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	// Every limiter reports to obs (middleware.WithObserver(obs)); here two
	// events stand in for a limiter's.
	obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 1,
		Latency: 120 * time.Microsecond})
	obs.Observe(middleware.Event{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip", Cost: 1,
		Latency: 90 * time.Microsecond})

	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(w.Body.String(), "\n") {
		if strings.HasPrefix(line, "tollgate_requests_total") || strings.HasPrefix(line, "tollgate_tokens_total") {
			fmt.Println(line)
		}
	}
	// Output:
	// tollgate_requests_total{key_class="ip",limiter="api",outcome="allowed"} 1
	// tollgate_requests_total{key_class="ip",limiter="api",outcome="denied"} 1
	// tollgate_tokens_total{key_class="ip",limiter="api"} 1
}
