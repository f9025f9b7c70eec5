package keyfuncs

import (
	"context"
	"fmt"
	"net/http"
)

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

// isTokenChar reports whether c may appear in an RFC 9110 token, such as a
// header name.
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
