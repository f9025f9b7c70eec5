package middleware

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/tollgate-go/tollgate/store"
)

// statusWriter records the status code a handler writes.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 { // 1xx are interim responses
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush lets streaming handlers flush through the wrapper.
func (s *statusWriter) Flush() {
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

// Hijack lets a handler take over the connection (WebSocket upgrades)
// through the wrapper, when the writer underneath allows it.
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(s.ResponseWriter).Hijack()
}

// Unwrap gives http.ResponseController the writer underneath.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) code() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}

// serveRefunding serves the request, then gives its cost back to the
// store key if the refund rule says so.
func (l *Limiter) serveRefunding(w http.ResponseWriter, r *http.Request, next http.Handler, key string, cost int) {
	sw := &statusWriter{ResponseWriter: w}
	next.ServeHTTP(sw, r)
	if !l.cfg.refund(r, sw.code()) {
		return
	}
	if l.BreakerState() == BreakerOpen {
		l.refundFailed(r, cost, ErrBreakerOpen) // no waiting on a store known to fail
		return
	}
	refunder := l.store.(store.Refunder) // checked by New
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), l.cfg.timeout)
	defer cancel()
	_, err := refunder.Refund(ctx, key, l.limit, cost)
	if err != nil {
		l.refundFailed(r, cost, err)
		return
	}
	if l.deny != nil {
		// Tokens came back: a denial cached meanwhile may be wrong now.
		// (Other servers' caches keep theirs until they expire.)
		l.deny.forget([]byte(key))
	}
}

// refundFailed reports a refund that could not be made: the tokens stay
// taken.
func (l *Limiter) refundFailed(r *http.Request, cost int, err error) {
	err = fmt.Errorf("middleware: %s: refund: %w", l.cfg.name, err)
	l.observe(r, Event{Kind: EventError, Cost: cost, Err: err})
}
