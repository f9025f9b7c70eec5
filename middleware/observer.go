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
	// EventAllowed: the request passed; its tokens were taken.
	EventAllowed EventKind = iota + 1
	// EventDenied: the request was refused with 429 (or, in dry-run mode,
	// would have been).
	EventDenied
	// EventError: the request could not be decided normally: a key
	// function error, a cost out of range, or a store error or timeout.
	EventError
	// EventFallback: the store failed and the failure policy decided
	// instead (served under FailOpen, refused under FailClosed, decided
	// on the local store under FailLocal). Reported after the EventError
	// of the same request.
	EventFallback
	// EventBreaker: the circuit breaker changed state.
	EventBreaker
	// EventSkipped: an allow-list or skip rule let the request through
	// without asking the store.
	EventSkipped
	// EventAbandoned: the client went away while the request waited for
	// its tokens (WithDelay); they were given back.
	EventAbandoned
)

func (k EventKind) String() string {
	switch k {
	case EventAllowed:
		return "allowed"
	case EventDenied:
		return "denied"
	case EventError:
		return "error"
	case EventFallback:
		return "fallback"
	case EventBreaker:
		return "breaker"
	case EventSkipped:
		return "skipped"
	case EventAbandoned:
		return "abandoned"
	}
	return "unknown"
}

// Event is one observation of a limiter. It never carries the raw key: a
// client's address, API key or user id would make an unbounded label set
// and leak into logs and metrics. KeyClass says what kind of key it was.
type Event struct {
	Kind    EventKind
	Limiter string // the limiter's name (a policy of a tier: "api/pro")
	// Request is the request decided (nil for EventBreaker), valid only
	// during Observe.
	Request *http.Request
	// Key is the subject the key function returned ("" before it ran):
	// unbounded, even client-chosen text, so never a metric label.
	Key string
	// KeyClass is the namespace of the request's key, as the key functions
	// of package keyfuncs write it ("ip", "user", "key", "route", joined
	// with "+" for a combination, such as "user+route"), or "other".
	// It takes few values, so it is safe as a metric label.
	KeyClass string
	Cost     int           // tokens asked for
	Latency  time.Duration // time spent deciding (the store call, or zero)
	Result   store.Result  // the decision (Allowed, Remaining, …); zero for errors
	Local    bool          // decided in process: the deny cache, or FailLocal
	Delay    time.Duration // allowed: how long the request waited for its tokens (WithDelay; in dry-run mode, would have)
	DryRun   bool          // the limiter is in dry-run mode
	Policy   FailurePolicy // for EventFallback: the policy that decided
	Err      error         // for EventError (and EventFallback): what failed
	// From and To are the breaker's states, for EventBreaker.
	From, To BreakerState
}

// Observer receives a limiter's events. Observe is called synchronously on
// the request's goroutine (or, for EventBreaker, the goroutine that moved
// the breaker), from many goroutines at once: it must be safe for
// concurrent use and quick — hand slow work to another goroutine.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to [Observer].
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// KeyClass returns the class of a key built by package keyfuncs: its
// namespace prefixes ("ip:1.2.3.4" → "ip", "user:42|route:GET /x" →
// "user+route", the parts split as [keyfuncs.Join] escapes them, repeats
// dropped); a key without a known namespace, or with more than three kinds
// of part, is "other". The result takes few distinct values (at most 85)
// whatever the keys, so a client cannot multiply metric series.
func KeyClass(key string) string {
	var parts [3]string
	n := 0
	for key != "" {
		// The next part ends at a '|' that Join did not escape.
		end := len(key)
		for i := 0; i < len(key); i++ {
			if key[i] == '\\' {
				i++
				continue
			}
			if key[i] == '|' {
				end = i
				break
			}
		}
		part := key[:end]
		key = key[min(end+1, len(key)):]
		ns, _, ok := strings.Cut(part, ":")
		if ok {
			ns, ok = knownClass(ns)
		}
		if !ok {
			return "other"
		}
		if slices.Contains(parts[:n], ns) {
			continue // a repeated namespace adds nothing
		}
		if n == len(parts) {
			return "other" // at most three kinds: the set of classes stays small
		}
		parts[n] = ns
		n++
	}
	switch n {
	case 0:
		return "other"
	case 1:
		return parts[0]
	}
	return strings.Join(parts[:n], "+")
}

// knownClass returns ns as a constant string (not a piece of a request's
// key, which a metric label would keep alive) when it is a known class.
func knownClass(ns string) (string, bool) {
	for _, c := range [...]string{"ip", "user", "key", "route", "tier"} {
		if ns == c {
			return c, true
		}
	}
	return "", false
}

// ErrorKind classifies an event's error without its text, which may quote
// the key: "timeout", "canceled", "breaker_open", "no_key", "cost",
// "config", "store_config" (the store's Redis refuses the script: an ACL
// without EVALSHA, EVAL or a command inside it, or no scripting; see
// store.Redis.Check) or "store".
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

// scriptRefused reports whether err says Redis will not run the script at
// all, whatever the load: a configuration to fix, not a passing failure.
func scriptRefused(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "noperm") || strings.Contains(msg, "can't run this command") ||
		strings.Contains(msg, "unknown command")
}

// SlogObserver returns an [Observer] that logs events to l: denials,
// errors, fallbacks and breaker changes at level Warn (errors, fallbacks,
// an open breaker) or Info; allowed and skipped requests at Debug, so they
// cost nothing unless the handler enables Debug.
func SlogObserver(l *slog.Logger) Observer {
	if l == nil {
		l = slog.Default()
	}
	return ObserverFunc(func(e Event) {
		level := slog.LevelInfo
		switch e.Kind {
		case EventAllowed, EventSkipped:
			level = slog.LevelDebug
		case EventError, EventFallback:
			level = slog.LevelWarn
		case EventBreaker:
			if e.To == BreakerOpen {
				level = slog.LevelWarn
			}
		}
		ctx := context.Background()
		if !l.Enabled(ctx, level) {
			return
		}
		attrs := []slog.Attr{
			slog.String("limiter", e.Limiter),
			slog.String("event", e.Kind.String()),
		}
		switch e.Kind {
		case EventBreaker:
			attrs = append(attrs, slog.String("from", e.From.String()), slog.String("to", e.To.String()))
		default:
			attrs = append(attrs, slog.String("key_class", e.KeyClass), slog.Int("cost", e.Cost),
				slog.Duration("latency", e.Latency))
			if e.Kind == EventAllowed || e.Kind == EventDenied {
				attrs = append(attrs, slog.Int("remaining", e.Result.Remaining))
			}
			if e.Kind == EventDenied {
				attrs = append(attrs, slog.Duration("retry_after", e.Result.RetryAfter))
			}
			if e.Local {
				attrs = append(attrs, slog.Bool("local", true))
			}
			if e.DryRun {
				attrs = append(attrs, slog.Bool("dry_run", true))
			}
			if e.Kind == EventFallback {
				attrs = append(attrs, slog.String("policy", e.Policy.String()))
			}
			if e.Err != nil {
				// The kind only: an error's text may quote the key.
				attrs = append(attrs, slog.String("error", ErrorKind(e.Err)))
			}
		}
		l.LogAttrs(ctx, level, "tollgate "+e.Kind.String(), attrs...)
	})
}
