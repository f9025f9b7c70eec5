// Package client is the other side of the wire: an [http.RoundTripper]
// for Go services that call a rate-limited API — tollgate's, GitHub's, any
// server that answers 429 or 503 with Retry-After or the IETF RateLimit
// fields. It waits out a refusal and sends an idempotent request again,
// within a cap on attempts and on the total wait, never sleeping past the
// request's deadline; optionally it paces requests so that they are not
// refused at all. It uses the standard library only.
//
//	c := &http.Client{Transport: &client.Transport{Pace: true}}
//	resp, err := c.Get("https://api.example.com/items")
package client

import (
	"cmp"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of a [Transport]'s zero fields.
const (
	DefaultMaxAttempts = 3
	DefaultMaxWait     = time.Minute
)

// Transport retries requests refused for their rate. On a 429 or a 503
// that says when to come back — Retry-After in seconds or as an HTTP date,
// else the t of an exhausted RateLimit item (r=0) — it waits that long,
// plus up to Jitter more, and sends the request again if it may: it is
// idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or Retryable says
// so) and its body can be replayed (none, or GetBody set, as
// http.NewRequest does for in-memory bodies). It gives up, returning the
// refusal, after MaxAttempts sends or once the waits would pass MaxWait or
// the request's deadline — at once, without sleeping. A refusal that says
// nothing about when is returned as it is.
//
// With Pace, a response whose RateLimit field says a policy has no tokens
// left (r=0) holds the next requests to its origin until t has passed (or
// the request's deadline comes first: then it goes at once, for the server
// to decide), so that a client that keeps to the limit is never refused.
//
// A Transport is safe for concurrent use; its fields must not change once
// it is in use.
type Transport struct {
	Base        http.RoundTripper        // nil: http.DefaultTransport
	MaxAttempts int                      // sends per request, the first included; 0: DefaultMaxAttempts
	MaxWait     time.Duration            // total wait per request; 0: DefaultMaxWait
	Jitter      float64                  // up to this share of a wait added at random, at most 1 (0: none; 0.1 spreads clients by 10 %)
	Retryable   func(*http.Request) bool // nil: the idempotent methods
	Pace        bool                     // hold requests while the origin's RateLimit says r=0
	mu          sync.Mutex               // guards notBefore
	notBefore   map[string]time.Time     // by origin, with Pace
}

// RoundTrip implements [http.RoundTripper].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	origin := req.URL.Scheme + "://" + req.URL.Host
	if t.Pace {
		if !sleep(req, time.Until(t.heldUntil(origin))) && req.Context().Err() != nil {
			if req.Body != nil {
				req.Body.Close() // a RoundTripper closes the body, errors included
			}
			return nil, req.Context().Err()
		}
	}
	var waited time.Duration
	for attempt := 1; ; attempt++ {
		resp, err := base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		if t.Pace {
			t.hold(origin, resp.Header)
		}
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
			return resp, nil
		}
		wait, ok := retryAfter(resp.Header, time.Now())
		if !ok || attempt >= cmp.Or(t.MaxAttempts, DefaultMaxAttempts) || !t.retryable(req) {
			return resp, nil
		}
		if t.Jitter > 0 {
			wait += time.Duration(rand.Float64() * min(t.Jitter, 1) * float64(wait))
		}
		if waited+wait > cmp.Or(t.MaxWait, DefaultMaxWait) {
			return resp, nil
		}
		if d, ok := req.Context().Deadline(); ok && !time.Now().Add(wait).Before(d) {
			return resp, nil // the deadline comes first: the refusal now, not after sleeping
		}
		if !sleep(req, wait) {
			return resp, nil // the request was cancelled: its refusal, unread
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
		resp.Body.Close()
		waited += wait
		req = next
	}
}

// retryable reports whether req may be sent again.
func (t *Transport) retryable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // its body is spent
	}
	if t.Retryable != nil {
		return t.Retryable(req)
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// rewind returns req with a fresh body for another send.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		next.Body = body
	}
	return next, nil
}

// sleep waits d unless req's context ends first, and reports whether it did.
func sleep(req *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	if deadline, ok := req.Context().Deadline(); ok && !time.Now().Add(d).Before(deadline) {
		return false // never past the deadline
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-req.Context().Done():
		return false
	}
}

// heldUntil returns when requests to origin may go, with Pace.
func (t *Transport) heldUntil(origin string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.notBefore[origin]
}

// hold records, from a response's headers, until when origin has no tokens.
func (t *Transport) hold(origin string, h http.Header) {
	d, ok := exhausted(h)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.notBefore == nil {
		t.notBefore = map[string]time.Time{}
	}
	if until := time.Now().Add(d); until.After(t.notBefore[origin]) {
		t.notBefore[origin] = until
	}
}

// retryAfter returns how long a refusal asks the client to wait: its
// Retry-After (delay-seconds or an HTTP date), else the longest t of its
// exhausted RateLimit items.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 && secs < 1<<31 {
			return time.Duration(secs) * time.Second, true
		}
		if at, err := http.ParseTime(v); err == nil {
			return max(at.Sub(now), 0), true
		}
	}
	return exhausted(h)
}

// exhausted returns the longest t (seconds) of the RateLimit items of h
// with r=0: how long until every exhausted policy has quota again.
func exhausted(h http.Header) (time.Duration, bool) {
	var longest time.Duration
	found := false
	for _, line := range h.Values("RateLimit") {
		for _, item := range splitList(line) {
			r, rok := param(item, "r")
			secs, tok := param(item, "t")
			if rok && tok && r == 0 {
				longest, found = max(longest, time.Duration(secs)*time.Second), true
			}
		}
	}
	return longest, found
}

// splitList splits a Structured Fields List at the commas outside strings.
func splitList(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// param returns the integer parameter name of a List member such as
// `"api";r=0;t=5` (the part after the quoted name), or false.
func param(item, name string) (int64, bool) {
	if i := strings.LastIndexByte(item, '"'); i >= 0 {
		item = item[i+1:]
	}
	for _, p := range strings.Split(item, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if ok && k == name {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil && n >= 0 && n < 1<<31
		}
	}
	return 0, false
}
