package promobserver

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the options.
const (
	DefaultNamespace   = "tollgate"
	DefaultMaxLimiters = 100
)

// DefaultBuckets are the upper bounds, in seconds, of the decision latency
// histogram: from 50µs (the Memory store, Redis on loopback) to 250ms,
// past the middleware's default 100ms budget.
var DefaultBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
}

// Option configures an [Observer].
type Option func(*config) error

type config struct {
	namespace   string
	constLabels prometheus.Labels
	buckets     []float64
	maxLimiters int
}

// WithNamespace sets the prefix of every metric name (default "tollgate":
// tollgate_requests_total). It must be a valid legacy Prometheus metric
// name ([a-zA-Z_:][a-zA-Z0-9_:]*); the empty string means no prefix.
func WithNamespace(ns string) Option {
	return func(c *config) error {
		if ns != "" && !validMetricName(ns) {
			return fmt.Errorf("WithNamespace: %q is not a valid metric name", ns)
		}
		c.namespace = ns
		return nil
	}
}

// WithConstLabels adds labels with fixed values to every metric, such as
// prometheus.Labels{"service": "checkout"} (default none). Names must be
// valid legacy label names, not reserved (starting with "__") and not one
// of the variable labels: limiter, key_class, outcome, to. Values must be
// valid UTF-8.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(c *config) error {
		for name, value := range labels {
			if !validLabelName(name) {
				return fmt.Errorf("WithConstLabels: %q is not a valid label name", name)
			}
			switch name {
			case labelLimiter, labelKeyClass, labelOutcome, labelTo:
				return fmt.Errorf("WithConstLabels: %q is a label of the metrics already", name)
			}
			if !utf8.ValidString(value) {
				return fmt.Errorf("WithConstLabels: the value of %q is not valid UTF-8", name)
			}
		}
		c.constLabels = make(prometheus.Labels, len(labels))
		for name, value := range labels {
			c.constLabels[name] = value // a copy: the caller's map may change
		}
		return nil
	}
}

// WithBuckets sets the upper bounds, in seconds, of the buckets of the
// decision latency histogram (default [DefaultBuckets]). They must be
// finite, positive and strictly increasing; the +Inf bucket is implicit.
func WithBuckets(buckets []float64) Option {
	return func(c *config) error {
		if len(buckets) == 0 {
			return errors.New("WithBuckets: no buckets")
		}
		for i, b := range buckets {
			if math.IsNaN(b) || math.IsInf(b, 0) || b <= 0 {
				return fmt.Errorf("WithBuckets: bucket %d (%v) is not finite and positive", i, b)
			}
			if i > 0 && b <= buckets[i-1] {
				return fmt.Errorf("WithBuckets: bucket %d (%v) is not above the one before", i, b)
			}
		}
		c.buckets = append([]float64(nil), buckets...)
		return nil
	}
}

// WithMaxLimiters sets how many distinct limiter names get a limiter label
// of their own (default 100). Events of further names are counted under
// limiter="other", which bounds the number of series however many limiters
// a program creates (one per tenant, say). n must be at least 1.
func WithMaxLimiters(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithMaxLimiters: %d is below 1", n)
		}
		c.maxLimiters = n
		return nil
	}
}

// validMetricName reports whether s matches [a-zA-Z_:][a-zA-Z0-9_:]*, the
// metric names every Prometheus version and exposition format accepts.
func validMetricName(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '_' || b == ':' || b >= '0' && b <= '9' && i > 0) {
			return false
		}
	}
	return s != ""
}

// validLabelName reports whether s matches [a-zA-Z_][a-zA-Z0-9_]* and is
// not reserved by Prometheus (a leading "__").
func validLabelName(s string) bool {
	if s == "" || len(s) >= 2 && s[:2] == "__" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '_' || b >= '0' && b <= '9' && i > 0) {
			return false
		}
	}
	return true
}
