package promobserver_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/promobserver"
)

// BenchmarkObserve measures Observe on series already seen, as on every
// request of a running server.
func BenchmarkObserve(b *testing.B) {
	allowed := middleware.Event{Kind: middleware.EventAllowed, Limiter: "api", KeyClass: "ip", Cost: 1,
		Latency: 150 * time.Microsecond}
	mixed := []middleware.Event{
		allowed,
		{Kind: middleware.EventAllowed, Limiter: "login", KeyClass: "user+route", Cost: 1, Latency: time.Millisecond},
		{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip", Cost: 1, Latency: 200 * time.Microsecond},
		{Kind: middleware.EventDenied, Limiter: "api", KeyClass: "ip", Cost: 1, Local: true},
		{Kind: middleware.EventSkipped, Limiter: "api"},
		{Kind: middleware.EventError, Limiter: "login", KeyClass: "user", Cost: 1, Latency: 100 * time.Millisecond},
		{Kind: middleware.EventFallback, Limiter: "login", KeyClass: "user", Cost: 1},
		{Kind: middleware.EventAllowed, Limiter: "search", KeyClass: "key", Cost: 3, Latency: 300 * time.Microsecond},
	}
	// Past the bounds: a limiter name beyond WithMaxLimiters and a key
	// class that is not one, both counted as "other".
	overflow := middleware.Event{Kind: middleware.EventAllowed, Limiter: "tenant-4711", KeyClass: "ip:10.0.0.1",
		Cost: 1, Latency: 150 * time.Microsecond}

	run := func(name string, events []middleware.Event, opts ...promobserver.Option) {
		obs, err := promobserver.New(opts...)
		if err != nil {
			b.Fatal(err)
		}
		obs.Observe(middleware.Event{Kind: middleware.EventAllowed, Limiter: "first", KeyClass: "ip"})
		for _, e := range events {
			obs.Observe(e)
		}
		b.Run(name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				obs.Observe(events[i%len(events)])
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					obs.Observe(events[i%len(events)])
				}
			})
		})
	}
	run("allowed", []middleware.Event{allowed})
	run("mixed", mixed)
	run("overflow", []middleware.Event{overflow}, promobserver.WithMaxLimiters(1))

	// For reference, the floor: the same metric updates on children
	// resolved beforehand, with no lookup at all.
	b.Run("children-reference/parallel", func(b *testing.B) {
		requests := prometheus.NewCounter(prometheus.CounterOpts{Name: "r"})
		tokens := prometheus.NewCounter(prometheus.CounterOpts{Name: "t"})
		latency := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "l", Buckets: promobserver.DefaultBuckets})
		e := allowed
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				requests.Inc()
				tokens.Add(float64(e.Cost))
				latency.Observe(e.Latency.Seconds())
			}
		})
	})

	// For reference, what the cache saves: the same metrics moved through
	// WithLabelValues on every event.
	b.Run("WithLabelValues-reference/parallel", func(b *testing.B) {
		requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"limiter", "key_class", "outcome"})
		tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t"}, []string{"limiter", "key_class"})
		latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "l", Buckets: promobserver.DefaultBuckets},
			[]string{"limiter", "outcome"})
		e := allowed
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				outcome := e.Kind.String()
				requests.WithLabelValues(e.Limiter, e.KeyClass, outcome).Inc()
				tokens.WithLabelValues(e.Limiter, e.KeyClass).Add(float64(e.Cost))
				latency.WithLabelValues(e.Limiter, outcome).Observe(e.Latency.Seconds())
			}
		})
	})
}
