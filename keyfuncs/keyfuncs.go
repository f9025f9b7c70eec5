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
)

// KeyFunc extracts the rate-limit subject of a request: the name of the
// bucket the request is charged to. It has the same shape as httprate's
// KeyFunc. A KeyFunc never returns an empty key with a nil error; a request
// it cannot key is an error, wrapping [ErrNoKey] when the request simply
// lacks what the KeyFunc reads. The KeyFuncs of this package are safe for
// concurrent use.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by every error that means "this request has no key":
// no usable peer address, a missing header, no authenticated user, no route
// pattern. Such a request must not be charged to a shared bucket; the
// middleware refuses it.
var ErrNoKey = errors.New("no key")

// ErrInvalidConfig is wrapped by the error of a constructor given unusable
// arguments: a bad prefix length, header name, trusted network, or nil
// function, or options that contradict each other.
var ErrInvalidConfig = errors.New("invalid configuration")

// maxPartLen is the longest user id or route pattern kept as it is in a key;
// longer ones, and ones that are not plain printable ASCII, are hashed.
const maxPartLen = 64

// hashLen is the length of a hashed subject: the first 22 characters (132
// bits) of the unpadded base64url SHA-256.
const hashLen = 22

// appendHash appends the first hashLen characters of the unpadded base64url
// encoding of the SHA-256 of s. Encoding the first 18 bytes (24 characters)
// gives exactly the prefix of the encoding of all 32.
func appendHash(b []byte, s string) []byte {
	sum := sha256.Sum256([]byte(s))
	var enc [24]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:18])
	return append(b, enc[:hashLen]...)
}

// subjectKey returns ns+s when s is at most maxPartLen bytes of printable
// ASCII (space to '~') and does not start with '#'; otherwise ns+"#" and the
// hash of s. A kept subject never starts with '#', so it never collides with
// a hashed one.
func subjectKey(ns, s string) string {
	if plain(s) {
		return ns + s
	}
	var buf [16 + 1 + hashLen]byte
	b := append(buf[:0], ns...)
	b = append(b, '#')
	return string(appendHash(b, s))
}

func plain(s string) bool {
	if len(s) > maxPartLen || (len(s) > 0 && s[0] == '#') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// addrSlotKey is the context key of an address slot; see WithAddressSlot.
type addrSlotKey struct{}

// WithAddressSlot returns a copy of ctx holding slot. The key functions
// that read the client's address from somewhere other than the TCP peer,
// [ClientIP] and [ClientIPFromContext], store there the address they
// resolved (whole, not grouped), whether called alone, in a [Join] or by a
// function of the caller's own; a slot left empty means the peer. The
// middleware's allow-list reads it, so that an address entry matches the
// client that the key function found behind the trusted proxies.
func WithAddressSlot(ctx context.Context, slot *netip.Addr) context.Context {
	return context.WithValue(ctx, addrSlotKey{}, slot)
}

// record stores addr in r's address slot, if it has one.
func record(r *http.Request, addr netip.Addr) {
	if slot, ok := r.Context().Value(addrSlotKey{}).(*netip.Addr); ok {
		*slot = addr
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("keyfuncs: %w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Static returns a KeyFunc that always returns key: one bucket shared by
// every request, a global limit. The key is used as given (it is not
// namespaced); pick one that cannot be mistaken for the keys of the other
// KeyFuncs, such as "global". An empty key is an error wrapping
// [ErrInvalidConfig].
func Static(key string) (KeyFunc, error) {
	if key == "" {
		return nil, invalid("Static key is empty")
	}
	return func(*http.Request) (string, error) { return key, nil }, nil
}

// Join combines key functions into one composite key, such as per user per
// route: the parts in order, separated by '|', each with '\' and '|'
// escaped by a '\' in front. The encoding is unambiguous: different tuples
// of parts never give the same key, whatever bytes they contain.
//
// The first error of a part is returned wrapped, naming the part's index
// from 0, so [ErrNoKey] still matches; a part returning an empty key is an
// error wrapping ErrNoKey. Join with no functions, or with a nil one, is an
// error wrapping [ErrInvalidConfig].
//
// The key is as long as its parts plus one byte between parts and one per
// escaped byte. Keys from [PeerIP], [PeerIPPrefix], [ClientIP] and [Header]
// hold no byte to escape; keys from [User], [Route] and [Pattern] may.
func Join(fns ...KeyFunc) (KeyFunc, error) {
	if len(fns) == 0 {
		return nil, invalid("Join needs at least one KeyFunc")
	}
	if i := slices.IndexFunc(fns, func(fn KeyFunc) bool { return fn == nil }); i >= 0 {
		return nil, invalid("Join part %d is nil", i)
	}
	fns = slices.Clone(fns) // the caller may reuse its slice
	return func(r *http.Request) (string, error) {
		// One allocation for the key when it fits the buffer (the parts
		// allocate their own).
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
