// Package otelobserver exports the events of tollgate's limiters as
// OpenTelemetry metrics, with the same bounded attributes as promobserver.
// It is a module of its own, so that OpenTelemetry never enters the go.mod
// of programs that use tollgate without it.
//
//	obs, err := otelobserver.New(otel.GetMeterProvider().Meter("tollgate"))
//	if err != nil { ... }
//	lim, err := middleware.New(st, limit, middleware.WithObserver(obs))
//
// # Metrics
//
//	tollgate.requests{limiter, key_class, outcome}     counter
//	tollgate.tokens{limiter, key_class}                counter, the tokens of allowed requests
//	tollgate.local_decisions{limiter, outcome}         counter, decided in process (deny cache, FailLocal)
//	tollgate.dry_run.denials{limiter}                  counter
//	tollgate.decision.duration{limiter, outcome}       histogram, seconds
//	tollgate.breaker.transitions{limiter, to}          counter
//
// outcome is the [middleware.EventKind] name: allowed, denied, error,
// fallback, skipped or abandoned. Attributes are bounded: at most 100
// limiter names and 32 key classes keep their own value (more, and
// malformed ones, are "other"); an event without a key has key class
// "none". The raw key never becomes an attribute.
package otelobserver

import (
	"context"
	"sync"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tollgate-go/tollgate/middleware"
)

// Bounds of the attributes, as promobserver's.
const (
	maxLimiters    = 100
	maxKeyClasses  = 32
	maxLimiterLen  = 128
	maxKeyClassLen = 32
	other, none    = "other", "none"
)

// Observer records a limiter's events in OpenTelemetry instruments. Give
// the same one to every limiter; it is safe for concurrent use. Its zero
// value is not usable: call [New].
type Observer struct {
	requests, tokens, local, dryRun, transitions metric.Int64Counter
	latency                                      metric.Float64Histogram

	limiters, classes boundedSet
}

// boundedSet is the values of one attribute that keep their own: at most
// max, each at most maxLen bytes of UTF-8; the others are "other".
type boundedSet struct {
	seen        sync.Map // value → struct{}: read without the lock
	mu          sync.Mutex
	n           int
	max, maxLen int
}

func (b *boundedSet) value(v string) string {
	if v == "" || len(v) > b.maxLen || !utf8.ValidString(v) {
		return other
	}
	if _, ok := b.seen.Load(v); ok {
		return v
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen.Load(v); !ok {
		if b.n >= b.max {
			return other
		}
		b.n++
		b.seen.Store(v, struct{}{})
	}
	return v
}

// New returns an Observer whose instruments m creates.
func New(m metric.Meter) (*Observer, error) {
	o := &Observer{limiters: boundedSet{max: maxLimiters, maxLen: maxLimiterLen},
		classes: boundedSet{max: maxKeyClasses, maxLen: maxKeyClassLen}}
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		c, e := m.Int64Counter(name, metric.WithDescription(desc))
		if err == nil {
			err = e
		}
		return c
	}
	o.requests = counter("tollgate.requests", "Requests a limiter decided, by outcome.")
	o.tokens = counter("tollgate.tokens", "Tokens taken by allowed requests.")
	o.local = counter("tollgate.local_decisions", "Decisions made in process: the deny cache, or FailLocal.")
	o.dryRun = counter("tollgate.dry_run.denials", "Requests a dry-run limiter would have refused.")
	o.transitions = counter("tollgate.breaker.transitions", "Circuit breaker state changes, by new state.")
	if err != nil {
		return nil, err
	}
	o.latency, err = m.Float64Histogram("tollgate.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent deciding: the store call."))
	if err != nil {
		return nil, err
	}
	return o, nil
}

// Observe implements [middleware.Observer].
func (o *Observer) Observe(e middleware.Event) {
	ctx := context.Background()
	limiter := attribute.String("limiter", o.limiters.value(e.Limiter))
	if e.Kind == middleware.EventBreaker {
		o.transitions.Add(ctx, 1, metric.WithAttributes(limiter, attribute.String("to", e.To.String())))
		return
	}
	if e.Kind.String() == "unknown" {
		return
	}
	class := none
	if e.KeyClass != "" && e.KeyClass != none {
		class = o.classes.value(e.KeyClass)
	}
	outcome := attribute.String("outcome", e.Kind.String())
	o.requests.Add(ctx, 1, metric.WithAttributes(limiter, attribute.String("key_class", class), outcome))
	if e.Kind == middleware.EventAllowed && e.Cost > 0 {
		o.tokens.Add(ctx, int64(e.Cost), metric.WithAttributes(limiter, attribute.String("key_class", class)))
	}
	if e.Local {
		o.local.Add(ctx, 1, metric.WithAttributes(limiter, outcome))
	}
	if e.DryRun && e.Kind == middleware.EventDenied {
		o.dryRun.Add(ctx, 1, metric.WithAttributes(limiter))
	}
	if e.Latency > 0 {
		o.latency.Record(ctx, e.Latency.Seconds(), metric.WithAttributes(limiter, outcome))
	}
}
