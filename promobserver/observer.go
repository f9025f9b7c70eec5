package promobserver

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tollgate-go/tollgate/middleware"
)

// Label names.
const (
	labelLimiter  = "limiter"
	labelKeyClass = "key_class"
	labelOutcome  = "outcome"
	labelTo       = "to"
)

// Label values written in place of the event's, and the bounds that decide.
const (
	other = "other" // a limiter or key class past the bounds, or malformed
	none  = "none"  // the key class of an event without a key

	maxKeyClasses  = 32  // distinct key classes besides "other" and "none"
	maxKeyClassLen = 32  // bytes
	maxLimiterLen  = 128 // bytes
)

// slotCount is the number of combinations of an event's kind and flags:
// see slot.
const slotCount = (int(middleware.EventAbandoned) + 1) << 3

// Observer counts a limiter's events in Prometheus metrics: it is a
// [middleware.Observer] and the [prometheus.Collector] that exports them.
// Create one with [New], register it once (reg.MustRegister(obs)) and give
// it to every limiter (middleware.WithObserver(obs)): the limiter label
// tells them apart.
//
// An Observer is safe for concurrent use. Its zero value is not usable.
type Observer struct {
	requests    *prometheus.CounterVec
	tokens      *prometheus.CounterVec
	local       *prometheus.CounterVec
	dryRun      *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	transitions *prometheus.CounterVec
	state       *prometheus.GaugeVec
	collectors  []prometheus.Collector

	maxLimiters int

	// Observe resolves an event's series without a lock and without
	// allocating: limiters, classes and every limiterSeries.classes are
	// read through atomic pointers and copied on write, under mu. Writes
	// happen once per new limiter name or key class, and both are bounded,
	// so the copies stay small and rare. Once a bound is reached the full
	// flag is set and unknown values go to "other" without taking mu.
	limiters     atomic.Pointer[map[string]*limiterSeries] // by event name; "other" included
	limitersFull atomic.Bool
	classes      atomic.Pointer[map[string]struct{}] // key classes with a label of their own
	classesFull  atomic.Bool
	other        *limiterSeries
	mu           sync.Mutex
	nLimiters    int // limiter names with a label of their own, under mu
}

// limiterSeries is the series of one limiter label.
type limiterSeries struct {
	label   string
	classes atomic.Pointer[[]*classSeries] // at most maxKeyClasses+2, copied on write
}

// classSeries is the series of one (limiter, key_class) pair, resolved
// lazily per slot so that only the series that events reach exist.
type classSeries struct {
	label string
	slots [slotCount]atomic.Pointer[kindSeries]
}

// kindSeries holds the children an event of one slot moves: resolved once,
// so that Observe calls no WithLabelValues (which hashes the label values
// and takes the vector's lock). A nil field is a metric the slot does not
// move.
type kindSeries struct {
	requests prometheus.Counter
	tokens   prometheus.Counter  // allowed
	latency  prometheus.Observer // allowed, denied, error, with a latency
	local    prometheus.Counter  // Local events
	dryRun   prometheus.Counter  // dry-run denials
}

// New returns an Observer with its metrics, which are exported once it is
// registered. It returns an error naming the bad option.
func New(opts ...Option) (*Observer, error) {
	c := config{namespace: DefaultNamespace, maxLimiters: DefaultMaxLimiters}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&c); err != nil {
			return nil, fmt.Errorf("promobserver: %w", err)
		}
	}
	if c.buckets == nil {
		c.buckets = slices.Clone(DefaultBuckets) // the exported slice may be changed later
	}

	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: c.namespace, Name: name, Help: help, ConstLabels: c.constLabels,
		}, labels)
	}
	o := &Observer{
		requests: counter("requests_total",
			"Limiter events by outcome: allowed, denied (dry-run denials included), error, fallback, skipped. "+
				"A request the store failed on counts an error, then a fallback.",
			labelLimiter, labelKeyClass, labelOutcome),
		tokens: counter("tokens_total",
			"Tokens taken by allowed requests (the sum of their costs).",
			labelLimiter, labelKeyClass),
		local: counter("local_decisions_total",
			"Events decided in process (the deny cache, FailLocal), by outcome; also in requests_total.",
			labelLimiter, labelOutcome),
		dryRun: counter("dry_run_denials_total",
			"Denials of limiters in dry-run mode, which were not enforced; also in requests_total as denied.",
			labelLimiter),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: c.namespace, Name: "decision_seconds", ConstLabels: c.constLabels, Buckets: c.buckets,
			Help: "Time spent deciding allowed, denied and error events that took time (a store call).",
		}, []string{labelLimiter, labelOutcome}),
		transitions: counter("breaker_transitions_total",
			"Circuit breaker transitions, by the state entered: closed, open, half-open.",
			labelLimiter, labelTo),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: c.namespace, Name: "breaker_state", ConstLabels: c.constLabels,
			Help: "Circuit breaker state after its last transition: 0 closed, 1 open, 2 half-open.",
		}, []string{labelLimiter}),
		maxLimiters: c.maxLimiters,
	}
	o.collectors = []prometheus.Collector{o.requests, o.tokens, o.local, o.dryRun, o.latency, o.transitions, o.state}

	// client_golang keeps a bad name or label in the Desc until it is
	// registered: a scratch registry reports it here rather than at the
	// user's MustRegister.
	if err := prometheus.NewRegistry().Register(o); err != nil {
		return nil, fmt.Errorf("promobserver: %w", err)
	}

	o.other = newLimiterSeries(other)
	o.limiters.Store(&map[string]*limiterSeries{other: o.other})
	o.classes.Store(&map[string]struct{}{})
	return o, nil
}

func newLimiterSeries(label string) *limiterSeries {
	l := &limiterSeries{label: label}
	l.classes.Store(&[]*classSeries{})
	return l
}

// Describe sends the descriptors of the Observer's metrics to ch; with
// Collect it makes the Observer a [prometheus.Collector].
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.collectors {
		c.Describe(ch)
	}
}

// Collect sends the Observer's metrics to ch.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.collectors {
		c.Collect(ch)
	}
}

// Observe counts e. Events of a kind this package does not know, and
// breaker events with an unknown state, are ignored.
func (o *Observer) Observe(e middleware.Event) {
	switch e.Kind {
	case middleware.EventAllowed, middleware.EventDenied, middleware.EventError,
		middleware.EventFallback, middleware.EventSkipped, middleware.EventAbandoned:
	case middleware.EventBreaker:
		o.observeBreaker(e)
		return
	default:
		return
	}
	s := o.series(e)
	s.requests.Inc()
	if s.tokens != nil && e.Cost > 0 { // a counter must not go down: never Add a negative cost
		s.tokens.Add(float64(e.Cost))
	}
	if s.latency != nil {
		s.latency.Observe(e.Latency.Seconds())
	}
	if s.local != nil {
		s.local.Inc()
	}
	if s.dryRun != nil {
		s.dryRun.Inc()
	}
}

// observeBreaker counts a breaker transition. It is rare (a few per outage)
// and resolves its children every time.
func (o *Observer) observeBreaker(e middleware.Event) {
	switch e.To {
	case middleware.BreakerClosed, middleware.BreakerOpen, middleware.BreakerHalfOpen:
	default:
		return
	}
	l := o.limiter(e.Limiter)
	o.transitions.WithLabelValues(l.label, e.To.String()).Inc()
	o.state.WithLabelValues(l.label).Set(float64(e.To))
}

// slot numbers the combinations of an event's kind, Local, DryRun (for a
// denial) and whether it has a latency to observe: each moves its own set
// of metrics, so that none is created that no event moves (such as an
// empty histogram for key errors, which never take time).
func slot(e middleware.Event) int {
	i := int(e.Kind) << 3
	if e.Local {
		i |= 4
	}
	if e.DryRun && e.Kind == middleware.EventDenied {
		i |= 2
	}
	if e.Latency > 0 && (e.Kind == middleware.EventAllowed || e.Kind == middleware.EventDenied || e.Kind == middleware.EventError) {
		i |= 1
	}
	return i
}

// series returns the children that e moves, creating them on first use.
func (o *Observer) series(e middleware.Event) *kindSeries {
	l := o.limiter(e.Limiter)
	c := o.class(l, e.KeyClass)
	i := slot(e)
	if s := c.slots[i].Load(); s != nil {
		return s
	}
	outcome := e.Kind.String() // allowed, denied, error, fallback, skipped or abandoned
	s := &kindSeries{requests: o.requests.WithLabelValues(l.label, c.label, outcome)}
	if e.Kind == middleware.EventAllowed {
		s.tokens = o.tokens.WithLabelValues(l.label, c.label)
	}
	if i&4 != 0 {
		s.local = o.local.WithLabelValues(l.label, outcome)
	}
	if i&2 != 0 {
		s.dryRun = o.dryRun.WithLabelValues(l.label)
	}
	if i&1 != 0 {
		s.latency = o.latency.WithLabelValues(l.label, outcome)
	}
	// Two goroutines may race to fill the slot: both resolved the same
	// children, and the first one stored is kept.
	if !c.slots[i].CompareAndSwap(nil, s) {
		s = c.slots[i].Load()
	}
	return s
}

// limiter returns the series of a limiter name: its own while there are
// fewer than maxLimiters, else those of "other". An empty, over-long or
// non-UTF-8 name is "other" too.
func (o *Observer) limiter(name string) *limiterSeries {
	if l, ok := (*o.limiters.Load())[name]; ok {
		return l
	}
	if name == "" || len(name) > maxLimiterLen || !utf8.ValidString(name) {
		return o.other
	}
	if o.limitersFull.Load() {
		// Read the map again: it may have gained this name after the load
		// above and before the flag was set, and never will after.
		if l, ok := (*o.limiters.Load())[name]; ok {
			return l
		}
		return o.other
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.limiters.Load()
	if l, ok := old[name]; ok {
		return l
	}
	if o.nLimiters >= o.maxLimiters {
		o.limitersFull.Store(true)
		return o.other
	}
	name = strings.Clone(name) // keep no larger string alive through the map
	l := newLimiterSeries(name)
	m := maps.Clone(old)
	m[name] = l
	o.limiters.Store(&m)
	o.nLimiters++
	return l
}

// class returns l's series of a key class, creating them on first use.
func (o *Observer) class(l *limiterSeries, raw string) *classSeries {
	if c := l.lookup(raw); c != nil {
		return c
	}
	label := o.classLabel(raw)
	if c := l.lookup(label); c != nil {
		return c
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if c := l.lookup(label); c != nil {
		return c
	}
	old := *l.classes.Load()
	// A copy (readers keep the old slice), and of the label too: it may be
	// the caller's string.
	cs := append(old[:len(old):len(old)], &classSeries{label: strings.Clone(label)})
	l.classes.Store(&cs)
	return cs[len(cs)-1]
}

// lookup returns l's series of a key_class label, or nil. A limiter sees
// few classes (most see one), so a scan beats a map lookup: comparing
// strings of other lengths is one comparison, and KeyClass returns the
// same constant strings, which compare equal by pointer.
func (l *limiterSeries) lookup(label string) *classSeries {
	for _, c := range *l.classes.Load() {
		if c.label == label {
			return c
		}
	}
	return nil
}

// classLabel returns the key_class label of a KeyClass: the class itself
// while it looks like one ([a-z]+ joined by "+", at most 32 bytes) and
// fewer than 32 others have been seen, "none" for no class, else "other".
func (o *Observer) classLabel(raw string) string {
	switch {
	case raw == "":
		return none
	case raw == other || raw == none:
		return raw
	case !validClass(raw):
		return other
	}
	if _, ok := (*o.classes.Load())[raw]; ok {
		return raw
	}
	if o.classesFull.Load() {
		if _, ok := (*o.classes.Load())[raw]; ok { // as in limiter
			return raw
		}
		return other
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.classes.Load()
	if _, ok := old[raw]; ok {
		return raw
	}
	if len(old) >= maxKeyClasses {
		o.classesFull.Store(true)
		return other
	}
	raw = strings.Clone(raw)
	m := maps.Clone(old)
	m[raw] = struct{}{}
	o.classes.Store(&m)
	return raw
}

// validClass reports whether s matches [a-z]+(\+[a-z]+)* and has at most
// maxKeyClassLen bytes: what middleware.KeyClass returns.
func validClass(s string) bool {
	if len(s) > maxKeyClassLen {
		return false
	}
	prev := byte('+') // s must not start with '+'
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b >= 'a' && b <= 'z':
		case b == '+' && prev != '+':
		default:
			return false
		}
		prev = b
	}
	return prev != '+' // nor be empty or end with '+'
}
