package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/store"
)

// EventKind says what an [Event] reports.
type EventKind uint8

const (
	// EventAllowed reports a request that passed; its tokens were taken.
	EventAllowed EventKind = iota + 1
	// EventDenied reports a refusal (429), or in dry-run mode one that would have been.
	EventDenied
	// EventError reports a key error, a cost out of range, or a store error or timeout.
	EventError
	// EventFallback follows a store's EventError: the failure policy decided.
	EventFallback
	// EventBreaker reports a change of the circuit breaker's state.
	EventBreaker
	// EventSkipped reports a request that a skip rule or the allow-list let through.
	EventSkipped
	// EventAbandoned reports a client that left while it waited (WithDelay); its tokens are back.
	EventAbandoned
)

var eventKinds = [...]string{"unknown", "allowed", "denied", "error", "fallback", "breaker", "skipped", "abandoned"}

// String returns the kind's name, such as "allowed", or "unknown".
func (k EventKind) String() string {
	if int(k) < len(eventKinds) {
		return eventKinds[k]
	}
	return "unknown"
}

// Event is one observation of a limiter; its Key is client-chosen: label metrics and logs by KeyClass.
type Event struct {
	Kind     EventKind
	Limiter  string        // the limiter's name (a policy of a tier: "api/pro")
	Request  *http.Request // the request decided (nil for EventBreaker), valid only during Observe
	Key      string        // the subject the key function returned ("" before it ran)
	KeyClass string        // KeyClass(Key), or "none" without a Key: a safe metric label
	Cost     int           // tokens asked for
	Latency  time.Duration // time spent deciding (the store call, or zero)
	Result   store.Result  // the decision (Allowed, Remaining, …); zero for errors
	Local    bool          // decided in process: the deny cache, or FailLocal
	Delay    time.Duration // allowed: how long the request waited for its tokens (WithDelay; in dry-run mode, would have)
	DryRun   bool          // the limiter is in dry-run mode
	Policy   FailurePolicy // for EventFallback: the policy that decided
	Err      error         // for EventError (and EventFallback): what failed
	From, To BreakerState  // for EventBreaker
}

// Observer receives a limiter's events, synchronously on the request's goroutine (for EventBreaker,
// the one that moved the breaker) and from many at once: Observe must be concurrency-safe and quick.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to [Observer].
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// KeyClass returns the namespaces of a keyfuncs key, a safe metric label of at most 85 values:
// "ip:1.2.3.4" → "ip", "user:42|route:GET /x" → "user+route" (parts split as [keyfuncs.Join] escapes
// them, repeats dropped); "other" for an unknown namespace or more than three kinds of part.
func KeyClass(key string) string {
	var parts [3]string
	n := 0
	for key != "" {
		end := len(key) // the part ends at a '|' that Join did not escape
		for i := 0; i < len(key) && end == len(key); i++ {
			switch key[i] {
			case '\\':
				i++
			case '|':
				end = i
			}
		}
		ns, _, ok := strings.Cut(key[:end], ":")
		key = key[min(end+1, len(key)):]
		c := slices.Index(keyClasses, ns)
		switch {
		case !ok || c < 0:
			return "other"
		case slices.Contains(parts[:n], ns): // a repeated namespace adds nothing
		case n == len(parts):
			return "other"
		default:
			parts[n] = keyClasses[c] // a constant: a label keeps no piece of a key alive
			n++
		}
	}
	if n == 0 {
		return "other"
	}
	return strings.Join(parts[:n], "+")
}

var keyClasses = []string{"ip", "user", "key", "route", "tier"}

// ErrorKind classifies an event's error without its text, which may quote the key: "timeout",
// "canceled", "breaker_open", "no_key", "cost", "config", "store_config" (Redis will not run the
// script: see store.Redis.Check) or "store".
func ErrorKind(err error) string {
	switch {
	case scriptRefused(err):
		return "store_config"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrBreakerOpen):
		return "breaker_open"
	case errors.Is(err, ErrCostOutOfRange):
		return "cost"
	case errors.Is(err, keyfuncs.ErrInvalidConfig):
		return "config"
	case errors.Is(err, keyfuncs.ErrNoKey):
		return "no_key"
	}
	return "store"
}

// scriptRefused reports whether err says Redis will not run the script at all.
func scriptRefused(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "noperm") || strings.Contains(msg, "can't run this command") ||
		strings.Contains(msg, "unknown command")
}

// SlogObserver returns an [Observer] that logs events to l (nil: [slog.Default]): errors, fallbacks
// and an open breaker at level Warn, denials and other breaker changes at Info, allowed and skipped
// requests at Debug (nothing to pay unless the handler enables it).
func SlogObserver(l *slog.Logger) Observer {
	if l == nil {
		l = slog.Default()
	}
	return ObserverFunc(func(e Event) {
		level := slog.LevelInfo
		switch {
		case e.Kind == EventAllowed || e.Kind == EventSkipped:
			level = slog.LevelDebug
		case e.Kind == EventError || e.Kind == EventFallback || e.Kind == EventBreaker && e.To == BreakerOpen:
			level = slog.LevelWarn
		}
		ctx := context.Background()
		if !l.Enabled(ctx, level) {
			return
		}
		attrs := []slog.Attr{slog.String("limiter", e.Limiter), slog.String("event", e.Kind.String())}
		add := func(ok bool, a slog.Attr) {
			if ok {
				attrs = append(attrs, a)
			}
		}
		if e.Kind == EventBreaker {
			attrs = append(attrs, slog.String("from", e.From.String()), slog.String("to", e.To.String()))
		} else {
			attrs = append(attrs, slog.String("key_class", e.KeyClass), slog.Int("cost", e.Cost), slog.Duration("latency", e.Latency))
			add(e.Kind == EventAllowed || e.Kind == EventDenied, slog.Int("remaining", e.Result.Remaining))
			add(e.Kind == EventDenied, slog.Duration("retry_after", e.Result.RetryAfter))
			add(e.Local, slog.Bool("local", true))
			add(e.DryRun, slog.Bool("dry_run", true))
			add(e.Kind == EventFallback, slog.String("policy", e.Policy.String()))
			add(e.Err != nil, slog.String("error", ErrorKind(e.Err))) // not its text, which may quote the key
		}
		l.LogAttrs(ctx, level, "tollgate "+e.Kind.String(), attrs...)
	})
}
