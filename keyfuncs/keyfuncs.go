package keyfuncs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// KeyFunc extracts the rate-limit subject of a request, its bucket's key, as
// httprate's KeyFunc does; it never returns an empty key with a nil error.
// This package's KeyFuncs are safe for concurrent use.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by a KeyFunc's error when the request lacks what it reads
// (a usable address, header, user or pattern); the middleware refuses it.
var ErrNoKey = errors.New("no key")

// ErrInvalidConfig is wrapped by the error of a constructor given unusable
// arguments or options (nil, empty, out of range or conflicting).
var ErrInvalidConfig = errors.New("invalid configuration")

const (
	maxPartLen = 64 // the longest user id or route pattern kept unhashed
	hashLen    = 22 // characters of base64url SHA-256 in a hash: 132 bits
)

// appendHash appends the hash of s (18 bytes of SHA-256 encode to a prefix of all 32's).
func appendHash(b []byte, s string) []byte {
	sum := sha256.Sum256([]byte(s))
	var enc [24]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:18])
	return append(b, enc[:hashLen]...)
}

// subjectKey returns errEmpty for an empty s, ns+s for up to maxPartLen bytes
// of printable ASCII not starting with '#' (the mark of a hash), else ns+"#"+hash.
func subjectKey(ns, s string, errEmpty error) (string, error) {
	printable := func(c byte) bool { return ' ' <= c && c <= '~' }
	switch {
	case s == "":
		return "", errEmpty
	case len(s) <= maxPartLen && !strings.HasPrefix(s, "#") && span(s, printable) == len(s):
		return ns + s, nil
	}
	var buf [16 + 1 + hashLen]byte
	return string(appendHash(append(append(buf[:0], ns...), '#'), s)), nil
}

type addrSlotKey struct{}

// WithAddressSlot returns a copy of ctx holding slot, where [ClientIP] and
// [ClientIPFromContext], however called, store the address they resolve
// (whole) for the middleware's allow-list; left empty, it means the peer.
func WithAddressSlot(ctx context.Context, slot *netip.Addr) context.Context {
	return context.WithValue(ctx, addrSlotKey{}, slot)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("keyfuncs: %w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Static returns a KeyFunc that returns key, not empty, for every request: a
// global limit. It is not namespaced: pick one unlike others, such as "global".
func Static(key string) (KeyFunc, error) {
	if key == "" {
		return nil, invalid("Static key is empty")
	}
	return func(*http.Request) (string, error) { return key, nil }, nil
}

// Join returns a KeyFunc of a composite key, such as per user per route: the
// parts' keys in order, separated by '|', with '\' and '|' escaped by a '\',
// so different tuples never share a key. A part's error is returned wrapped,
// and an empty key as [ErrNoKey], naming the part's index from 0.
func Join(fns ...KeyFunc) (KeyFunc, error) {
	if len(fns) == 0 {
		return nil, invalid("Join needs at least one KeyFunc")
	}
	if i := slices.IndexFunc(fns, func(fn KeyFunc) bool { return fn == nil }); i >= 0 {
		return nil, invalid("Join part %d is nil", i)
	}
	fns = slices.Clone(fns) // the caller may reuse its slice
	return func(r *http.Request) (string, error) {
		b := make([]byte, 0, 128) // one allocation for the key when it fits
		for i, fn := range fns {
			k, err := fn(r)
			if err != nil {
				return "", fmt.Errorf("keyfuncs: Join part %d: %w", i, err)
			}
			if k == "" {
				return "", fmt.Errorf("keyfuncs: %w: Join part %d returned an empty key", ErrNoKey, i)
			}
			if i > 0 {
				b = append(b, '|')
			}
			for j := 0; j < len(k); j++ {
				if k[j] == '\\' || k[j] == '|' {
					b = append(b, '\\')
				}
				b = append(b, k[j])
			}
		}
		return string(b), nil
	}, nil
}

// Header keys a request by a header that identifies the client, such as an
// API key: "key:" and the hash of the value (26 bytes), so the secret never
// reaches the store. The name is canonicalised; the first field line is used
// as it is, not split or trimmed, and must not be empty.
func Header(name string) (KeyFunc, error) {
	if !validHeaderName(name) {
		return nil, invalid("Header name %q is not a valid header field name", name)
	}
	canon := http.CanonicalHeaderKey(name)
	// Built once: requests without the header cost no allocation.
	errMissing := fmt.Errorf("keyfuncs: %w: header %s is missing or empty", ErrNoKey, canon)
	return func(r *http.Request) (string, error) {
		v := r.Header[canon]
		if len(v) == 0 || v[0] == "" {
			return "", errMissing
		}
		var buf [4 + hashLen]byte
		return string(appendHash(append(buf[:0], "key:"...), v[0])), nil
	}, nil
}

func validHeaderName(s string) bool {
	return s != "" && span(s, isTokenChar) == len(s)
}

// isTokenChar reports whether c may appear in an RFC 9110 token (a header name).
func isTokenChar(c byte) bool {
	switch c {
	case '"', '(', ')', ',', '/', ':', ';', '<', '=', '>', '?', '@', '[', '\\', ']', '{', '}':
		return false
	}
	return c > ' ' && c < 0x7f
}

// User keys a request by the authenticated user id that fn reads from its
// context: "user:<id>", or "user:#" and the hash of an id longer than 64
// bytes, starting with '#' or with a byte outside printable ASCII.
func User(fn func(ctx context.Context) string) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("User function is nil")
	}
	return func(r *http.Request) (string, error) {
		return subjectKey("user:", fn(r.Context()), errNoUser)
	}, nil
}

var errNoUser = fmt.Errorf("keyfuncs: %w: no authenticated user in the request context", ErrNoKey)

// Pattern keys a request by the [http.ServeMux] pattern that matched it:
// "route:<pattern>", hashed as [User] hashes ids. The mux sets the pattern as
// it routes, so the limiter must wrap a handler registered in the mux, not it.
func Pattern(r *http.Request) (string, error) {
	return subjectKey("route:", r.Pattern, errNoPattern)
}

var errNoPattern = fmt.Errorf("keyfuncs: %w: %w: no ServeMux pattern (Request.Pattern is empty): "+
	"wrap a handler registered in the mux, not the mux", ErrInvalidConfig, ErrNoKey)

// Route keys a request by the route pattern fn reads, for other routers, as
// [Pattern] does. With chi, fn returns
// chi.RouteContext(r.Context()).RoutePattern() and the limiter runs as route
// middleware (r.With, or r.Use in r.Group): under r.Use of a Mux or r.Route
// it would read the pattern matched so far, shared by every route below.
func Route(fn func(r *http.Request) string) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("Route function is nil")
	}
	return func(r *http.Request) (string, error) {
		return subjectKey("route:", fn(r), errNoRoute)
	}, nil
}

var errNoRoute = fmt.Errorf("keyfuncs: %w: the Route function returned no pattern", ErrNoKey)
