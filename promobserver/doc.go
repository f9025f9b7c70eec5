// Package promobserver exports the events of tollgate's limiters as
// Prometheus metrics. It is a module of its own, so that the Prometheus
// client never enters the go.mod of programs that use tollgate without it.
//
//	obs, err := promobserver.New()
//	if err != nil { ... }
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(obs)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// An [*Observer] is a [middleware.Observer]: give the same one to every
// limiter, whose name becomes the limiter label.
//
// # Metrics
//
// With the default namespace "tollgate" ([WithNamespace]):
//
//	tollgate_requests_total{limiter, key_class, outcome}     counter
//	tollgate_tokens_total{limiter, key_class}                counter
//	tollgate_local_decisions_total{limiter, outcome}         counter
//	tollgate_dry_run_denials_total{limiter}                  counter
//	tollgate_decision_seconds{limiter, outcome}              histogram
//	tollgate_breaker_transitions_total{limiter, to}          counter
//	tollgate_breaker_state{limiter}                          gauge
//
// requests_total counts events by outcome: "allowed", "denied", "error",
// "fallback" and "skipped" ([middleware.EventKind] names). A request the
// store failed on is reported twice, as an error and then as a fallback
// (the failure policy's decision), so the requests a limiter saw are
// allowed + denied + error + skipped, and fallback is the part of the
// errors the failure policy decided (the rest are key errors and costs out
// of range). Denials in dry-run mode are counted as denied, like the
// others, and also in dry_run_denials_total: the requests actually refused
// are denied − dry_run_denials.
//
// tokens_total adds up the Cost of allowed requests (zero-cost reads add
// nothing). local_decisions_total counts, by the same outcomes, the events
// decided in process (Event.Local: the deny cache, FailLocal); they are in
// requests_total too.
//
// decision_seconds is the histogram of Event.Latency (the store call) of
// allowed, denied and error events; events with no latency, which did not
// call the store (a key error, a deny-cache hit), are left out, so that
// they do not hide the store's latency. The default buckets
// ([DefaultBuckets]) go from 50µs to 250ms; see [WithBuckets].
//
// breaker_transitions_total counts the circuit breaker's transitions by the
// state entered, to="closed", "open" or "half-open". breaker_state is the
// state after the last transition, as the values of
// [middleware.BreakerState]: 0 closed, 1 open, 2 half-open (so
// breaker_state > 0 means the store is not being called normally). It
// exists once a limiter's breaker has moved.
//
// # Bounded labels
//
// An Event never carries the request's key, and none of these labels can
// take one: the number of series is bounded whatever the traffic.
//
//   - outcome and to take the fixed values above.
//   - key_class is the event's KeyClass (see [middleware.KeyClass]) when
//     it looks like one — lower-case words joined by "+", at most 32 bytes
//     — and it is one of the first 32 distinct such classes seen; anything
//     else is "other". An event without a key class (a skipped request, a
//     key error) has key_class="none".
//   - limiter is the limiter's name for the first [WithMaxLimiters]
//     distinct names (default 100); the events of further names, and
//     names that are empty, longer than 128 bytes or not UTF-8, are
//     counted under limiter="other" (and a limiter named "other" shares
//     them). The breaker_state of "other" is the last transition of any
//     of them.
//
// At most, with the defaults, requests_total has 101 × 34 × 5 series; in
// practice a few limiters and key classes make a few dozen.
//
// # Cost
//
// Observe is called on every request, from many goroutines. It takes no
// lock and allocates nothing once an event's (limiter, key class, outcome)
// has been seen: the metric children are resolved then and kept where the
// hot path reads them through atomic pointers, so an event costs a map
// lookup (the limiter), a scan of the few key classes of that limiter, and
// the atomic additions of the counters and the histogram.
package promobserver
