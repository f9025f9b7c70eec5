package keyfuncs

import (
	"context"
	"fmt"
	"net/http"
)

// Header keys a request by a header that identifies the client, such as an
// API key: "key:" and the first 22 characters of the unpadded base64url
// SHA-256 of the value (26 bytes in all), so the secret itself never reaches
// the store. Values are compared exactly, with no trimming or case folding.
//
// The name is canonicalised ("x-api-key" reads X-Api-Key). When the header
// has several field lines, the first one is used; values are not split at
// commas. A missing header, or an empty first value, is an error wrapping
// [ErrNoKey], never a shared bucket. A name that is not a valid header field
// name is an error wrapping [ErrInvalidConfig].
func Header(name string) (KeyFunc, error) {
	if !validHeaderName(name) {
		return nil, invalid("Header name %q is not a valid header field name", name)
	}
	canon := http.CanonicalHeaderKey(name)
	// Built once: a flood of requests without the header costs no allocation.
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

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	return s != "" && span(s, isTokenChar) == len(s)
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	switch c {
	case '"', '(', ')', ',', '/', ':', ';', '<', '=', '>', '?', '@', '[', '\\', ']', '{', '}':
		return false
	}
	return c > ' ' && c < 0x7f
}

// User keys a request by the authenticated user id that fn reads from the
// request's context, where the app's authentication middleware put it:
// "user:<id>". An id longer than 64 bytes, with a byte outside printable
// ASCII (space to '~'), or starting with '#' is hashed instead:
// "user:#<hash>", the first 22 characters of the unpadded base64url SHA-256
// of the id. Keys are at most 69 bytes.
//
// fn returning "" (no authenticated user) is an error wrapping [ErrNoKey].
// A nil fn is an error wrapping [ErrInvalidConfig].
func User(fn func(ctx context.Context) string) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("User function is nil")
	}
	return func(r *http.Request) (string, error) {
		id := fn(r.Context())
		if id == "" {
			return "", errNoUser
		}
		return subjectKey("user:", id), nil
	}, nil
}

var errNoUser = fmt.Errorf("keyfuncs: %w: no authenticated user in the request context", ErrNoKey)
