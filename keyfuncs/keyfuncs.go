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

// KeyFunc extracts the rate-limit subject of a request, the key of the
// bucket it is charged to, as httprate's KeyFunc does. It never returns an
// empty key with a nil error. This package's KeyFuncs are safe for
// concurrent use.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by a KeyFunc's error when the request lacks what it
// reads (a usable address, header, user or pattern): the middleware refuses
// such a request rather than charge a shared bucket.
var ErrNoKey = errors.New("no key")

// ErrInvalidConfig is wrapped by the error of a constructor given unusable
// arguments or options (nil, empty, out of range or conflicting).
var ErrInvalidConfig = errors.New("invalid configuration")

const (
	maxPartLen = 64 // the longest user id or route pattern kept unhashed
	hashLen    = 22 // characters of base64url SHA-256 in a hash: 132 bits
)

// appendHash appends the hash of s: 18 bytes of SHA-256 encode to a prefix
// of the encoding of all 32.
func appendHash(b []byte, s string) []byte {
	sum := sha256.Sum256([]byte(s))
	var enc [24]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:18])
	return append(b, enc[:hashLen]...)
}

// subjectKey returns ns+s, or ns+"#" and the hash of s unless s is at most
// maxPartLen bytes of printable ASCII not starting with '#' (so it never
// poses as a hashed one), or errEmpty for an empty s.
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
// (whole); a slot left empty means the peer. The middleware's allow-list
// reads it.
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
		// One allocation for the key when it fits.
		var buf [128]byte
		b := buf[:0]
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
			b = appendEscaped(b, k)
		}
		return string(b), nil
	}, nil
}

// appendEscaped appends s with a '\' before each '\' and '|'.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\\' || c == '|' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return b
}
