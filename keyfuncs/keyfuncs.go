package keyfuncs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sync"
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

// ErrInvalidConfig is wrapped by the error of a KeyFunc built from unusable
// arguments: a bad prefix length, header name, trusted network, or nil
// function, or options that contradict each other. Constructors that return
// an error return it at once; those that return only a KeyFunc (such as
// [Header] and [Join]) return one that fails every request with it, which
// [ConfigError] reports (and middleware.New refuses) before any request.
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

// failing returns a KeyFunc that fails every request with err: the way
// constructors without an error result report a bad configuration, which
// [ConfigError] finds before any request. It is never inlined: an inlined
// copy would make closures with code of their own, which ConfigError would
// not know.
//
//go:noinline
func failing(err error) KeyFunc {
	return func(*http.Request) (string, error) { return "", err }
}

// failingCode identifies the KeyFuncs failing returns: every closure of
// one function literal has the same code.
var failingCode = reflect.ValueOf(failing(nil)).Pointer()

// KeysByAddress reports whether fn keys requests by their client's address:
// it is [PeerIP], or a KeyFunc that [PeerIPPrefix], [ClientIP] or
// [ClientIPFromContext] made, or a [Join] whose first part is one of those.
// Its keys ("ip:192.0.2.1", "ip:2001:db8:1:2::/64", first in a Join) then
// name the address that it resolved (through the trusted proxies), which
// middleware's allow-list matches; the keys of any other KeyFunc may be any
// text, even text a client chose.
func KeysByAddress(fn KeyFunc) bool {
	return fn != nil && slices.Contains(addressCode(), reflect.ValueOf(fn).Pointer())
}

// addressCode is the code of the KeyFuncs that key by address: every
// closure of one function literal (or method value) has the same code. The
// constructors that return closures are never inlined, which would give
// their closures code of their own.
var addressCode = sync.OnceValue(func() []uintptr {
	clientIP, _ := ClientIP()
	fromCtx, _ := ClientIPFromContext(func(context.Context) string { return "" })
	peerPrefix, _ := PeerIPPrefix(32, 64)
	code := []uintptr{}
	for _, fn := range []KeyFunc{PeerIP, peerPrefix, clientIP, fromCtx, addressJoin(nil)} {
		code = append(code, reflect.ValueOf(fn).Pointer())
	}
	return code
})

// addressJoin returns join, a Join whose first part keys by address, as a
// KeyFunc that [KeysByAddress] knows.
//
//go:noinline
func addressJoin(join KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) { return join(r) }
}

// ConfigError returns the error of a KeyFunc that a constructor of this
// package made from bad arguments, such as Header("bad name") or
// Static(""), which fails every request with that error (wrapping
// [ErrInvalidConfig]); for any other KeyFunc, nil. middleware.New calls it,
// so that such a KeyFunc is an error when the limiter is built rather than
// a refused request later.
func ConfigError(fn KeyFunc) error {
	if fn == nil || reflect.ValueOf(fn).Pointer() != failingCode {
		return nil
	}
	_, err := fn(nil)
	return err
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("keyfuncs: %w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Static returns a KeyFunc that always returns key: one bucket shared by
// every request, a global limit. The key is used as given (it is not
// namespaced); pick one that cannot be mistaken for the keys of the other
// KeyFuncs, such as "global". An empty key gives a KeyFunc that fails every
// request with an error wrapping [ErrInvalidConfig].
func Static(key string) KeyFunc {
	if key == "" {
		return failing(invalid("Static key is empty"))
	}
	return func(*http.Request) (string, error) { return key, nil }
}

// Join combines key functions into one composite key, such as per user per
// route: the parts in order, separated by '|', each with '\' and '|'
// escaped by a '\' in front. The encoding is unambiguous: different tuples
// of parts never give the same key, whatever bytes they contain.
//
// The first error of a part is returned wrapped, naming the part's index
// from 0, so [ErrNoKey] still matches; a part returning an empty key is an
// error wrapping ErrNoKey. Join with no functions, or with a nil one, gives
// a KeyFunc that fails every request with an error wrapping
// [ErrInvalidConfig].
//
// The key is as long as its parts plus one byte between parts and one per
// escaped byte. Keys from [PeerIP], [PeerIPPrefix], [ClientIP] and [Header]
// hold no byte to escape; keys from [User], [Route] and [Pattern] may.
func Join(fns ...KeyFunc) KeyFunc {
	if len(fns) == 0 {
		return failing(invalid("Join needs at least one KeyFunc"))
	}
	if i := slices.IndexFunc(fns, func(fn KeyFunc) bool { return fn == nil }); i >= 0 {
		return failing(invalid("Join part %d is nil", i))
	}
	for i, fn := range fns {
		if err := ConfigError(fn); err != nil {
			return failing(fmt.Errorf("keyfuncs: Join part %d: %w", i, err))
		}
	}
	fns = slices.Clone(fns) // the caller may reuse its slice
	join := func(r *http.Request) (string, error) {
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
	}
	if KeysByAddress(fns[0]) {
		return addressJoin(join)
	}
	return join
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
