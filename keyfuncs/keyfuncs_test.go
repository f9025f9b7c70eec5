package keyfuncs_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/tollgate-go/tollgate/keyfuncs"
)

// hash is the 22-character hash the package puts in keys, computed here the
// slow, obvious way.
func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:])[:22]
}

func TestHeader(t *testing.T) {
	kf := mustKey(keyfuncs.Header("x-api-key"))
	key := func(values ...string) (string, error) {
		r := httptest.NewRequest("GET", "/", nil)
		for _, v := range values {
			r.Header.Add("X-Api-Key", v)
		}
		return kf(r)
	}

	t.Run("hash of the value", func(t *testing.T) {
		got, err := key("sk_live_secret")
		if want := "key:" + hash("sk_live_secret"); err != nil || got != want {
			t.Errorf("got %q, %v; want %q, nil", got, err, want)
		}
		if len(got) != 26 {
			t.Errorf("got a key of %d bytes, want 26", len(got))
		}
	})
	t.Run("raw secret not in the key", func(t *testing.T) {
		got, _ := key("sk_live_secret")
		for _, part := range []string{"sk_live_secret", "secret", base64.RawURLEncoding.EncodeToString([]byte("sk_live_secret"))[:8]} {
			if strings.Contains(got, part) {
				t.Errorf("got %q, which contains %q", got, part)
			}
		}
	})
	t.Run("same value same key", func(t *testing.T) {
		a, _ := key("k1")
		b, _ := key("k1")
		if a != b || a == "" {
			t.Errorf("got %q and %q, want the same non-empty key", a, b)
		}
	})
	t.Run("different values differ", func(t *testing.T) {
		seen := map[string]string{}
		for _, v := range []string{"k1", "k2", "K1", "k1 ", " k1", "k", "k10"} {
			got, err := key(v)
			if err != nil {
				t.Fatalf("value %q: %v", v, err)
			}
			if prev, dup := seen[got]; dup {
				t.Errorf("values %q and %q both got %q", prev, v, got)
			}
			seen[got] = v
		}
	})
	t.Run("first field line", func(t *testing.T) {
		got, err := key("first", "second")
		if want := "key:" + hash("first"); err != nil || got != want {
			t.Errorf("got %q, %v; want %q, nil", got, err, want)
		}
	})
	t.Run("no comma splitting", func(t *testing.T) {
		got, err := key("a, b")
		if want := "key:" + hash("a, b"); err != nil || got != want {
			t.Errorf("got %q, %v; want %q, nil", got, err, want)
		}
	})
	for _, tt := range []struct {
		name   string
		values []string
	}{
		{"missing", nil},
		{"empty", []string{""}},
		{"empty first field line", []string{"", "second"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := key(tt.values...)
			if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
				t.Errorf("got %q, %v; want \"\", an error wrapping ErrNoKey", got, err)
			}
			if err != nil && !strings.Contains(err.Error(), "X-Api-Key") {
				t.Errorf("error %q does not name the header", err)
			}
		})
	}
	t.Run("other header", func(t *testing.T) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer x")
		if got, err := kf(r); !errors.Is(err, keyfuncs.ErrNoKey) {
			t.Errorf("got %q, %v; want an error wrapping ErrNoKey", got, err)
		}
		got, err := mustKey(keyfuncs.Header("Authorization"))(r)
		if want := "key:" + hash("Bearer x"); err != nil || got != want {
			t.Errorf("Header(Authorization): got %q, %v; want %q, nil", got, err, want)
		}
	})
}

func TestHeaderInvalidName(t *testing.T) {
	for _, name := range []string{"", "X Api", "X-Api:", "X-Äpi", "X\x00", "(x)"} {
		t.Run(name, func(t *testing.T) {
			kf, err := keyfuncs.Header(name)
			if !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
				t.Errorf("Header(%q) = %p, %v; want nil, an error wrapping ErrInvalidConfig", name, kf, err)
			}
			if errors.Is(err, keyfuncs.ErrNoKey) {
				t.Errorf("Header(%q): error %v wraps ErrNoKey; want a configuration error only", name, err)
			}
		})
	}
}

type userKey struct{}

func userFromContext(ctx context.Context) string {
	id, _ := ctx.Value(userKey{}).(string)
	return id
}

func TestUser(t *testing.T) {
	kf := mustKey(keyfuncs.User(userFromContext))
	key := func(id string) (string, error) {
		r := httptest.NewRequest("GET", "/", nil)
		if id != "" {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, id))
		}
		return kf(r)
	}
	long := strings.Repeat("x", 65)
	tests := []struct {
		name, id, want string
	}{
		{"plain id", "42", "user:42"},
		{"email", "ana@example.com", "user:ana@example.com"},
		{"non-ASCII hashed", "Ana María|x", "user:#" + hash("Ana María|x")},
		{"printable ASCII kept", " !~|\\{}", "user: !~|\\{}"},
		{"64 bytes kept", strings.Repeat("x", 64), "user:" + strings.Repeat("x", 64)},
		{"65 bytes hashed", long, "user:#" + hash(long)},
		{"control byte hashed", "a\x00b", "user:#" + hash("a\x00b")},
		{"DEL hashed", "a\x7f", "user:#" + hash("a\x7f")},
		{"newline hashed", "a\nb", "user:#" + hash("a\nb")},
		{"leading # hashed", "#abc", "user:#" + hash("#abc")},
		{"hashed form hashed again", "#" + hash(long), "user:#" + hash("#"+hash(long))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := key(tt.id)
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q, nil", got, err, tt.want)
			}
			if len(got) > 69 {
				t.Errorf("got a key of %d bytes, want at most 69", len(got))
			}
		})
	}
	t.Run("an id cannot pose as a hashed one", func(t *testing.T) {
		a, _ := key(long)
		b, _ := key("#" + hash(long))
		if a == b {
			t.Errorf("ids %q and %q both got %q", long, "#"+hash(long), a)
		}
	})
	t.Run("no user", func(t *testing.T) {
		got, err := key("")
		if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
			t.Errorf("got %q, %v; want \"\", an error wrapping ErrNoKey", got, err)
		}
	})
	t.Run("nil function", func(t *testing.T) {
		if kf, err := keyfuncs.User(nil); !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
			t.Errorf("User(nil) = %p, %v; want nil, an error wrapping ErrInvalidConfig", kf, err)
		}
	})
}

// record is middleware in the place of a limiter: it puts the key that kf
// gives, "ErrNoKey", or "error: " and the error, in the response header
// named header, and calls next.
func record(header string, kf keyfuncs.KeyFunc, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := kf(r)
		switch {
		case errors.Is(err, keyfuncs.ErrNoKey):
			key = "ErrNoKey"
		case err != nil:
			key = "error: " + err.Error()
		}
		w.Header().Set(header, key)
		next.ServeHTTP(w, r)
	})
}

// get returns the response header named header of a GET of url.
func get(t *testing.T, url, header string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get(header)
}

func TestPattern(t *testing.T) {
	long := "/" + strings.Repeat("a", 70)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux := http.NewServeMux()
	// The limiter wraps the handlers registered in the mux.
	for _, pattern := range []string{"GET /items/{id}", "/static/", long, "/café"} {
		mux.Handle(pattern, record("Key", keyfuncs.Pattern, ok))
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	tests := []struct {
		name, path, want string
	}{
		{"method and wildcard", "/items/7", "route:GET /items/{id}"},
		{"other item same key", "/items/8", "route:GET /items/{id}"},
		{"subtree", "/static/css/app.css", "route:/static/"},
		{"long pattern hashed", long, "route:#" + hash(long)},
		{"non-ASCII pattern hashed", "/caf%C3%A9", "route:#" + hash("/café")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := get(t, srv.URL+tt.path, "Key"); got != tt.want {
				t.Errorf("GET %s: got %q, want %q", tt.path, got, tt.want)
			}
		})
	}

	t.Run("limiter around the mux", func(t *testing.T) {
		outer := httptest.NewServer(record("Outer-Key", keyfuncs.Pattern, mux))
		t.Cleanup(outer.Close)
		if got := get(t, outer.URL+"/items/7", "Outer-Key"); got != "ErrNoKey" {
			t.Errorf("got %q, want ErrNoKey", got)
		}
	})
	t.Run("not routed", func(t *testing.T) {
		got, err := keyfuncs.Pattern(httptest.NewRequest("GET", "/items/7", nil))
		if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
			t.Errorf("got %q, %v; want \"\", an error wrapping ErrNoKey", got, err)
		}
	})
}

func TestRoute(t *testing.T) {
	// A stand-in for a router that stores the matched pattern in the context.
	type routeKey struct{}
	kf := mustKey(keyfuncs.Route(func(r *http.Request) string {
		p, _ := r.Context().Value(routeKey{}).(string)
		return p
	}))
	key := func(pattern string) (string, error) {
		r := httptest.NewRequest("GET", "/", nil)
		return kf(r.WithContext(context.WithValue(r.Context(), routeKey{}, pattern)))
	}
	long := "/api/v1/" + strings.Repeat("x", 60)
	tests := []struct {
		name, pattern, want string
	}{
		{"chi pattern", "/items/{id}", "route:/items/{id}"},
		{"gorilla pattern", "/items/{id:[0-9]+}", "route:/items/{id:[0-9]+}"},
		{"long pattern hashed", long, "route:#" + hash(long)},
		{"control byte hashed", "/a\tb", "route:#" + hash("/a\tb")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := key(tt.pattern)
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q, nil", got, err, tt.want)
			}
		})
	}
	t.Run("no pattern", func(t *testing.T) {
		got, err := key("")
		if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
			t.Errorf("got %q, %v; want \"\", an error wrapping ErrNoKey", got, err)
		}
	})
	t.Run("nil function", func(t *testing.T) {
		if kf, err := keyfuncs.Route(nil); !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
			t.Errorf("Route(nil) = %p, %v; want nil, an error wrapping ErrInvalidConfig", kf, err)
		}
	})
}

func TestStatic(t *testing.T) {
	kf := mustKey(keyfuncs.Static("global"))
	for _, remoteAddr := range []string{"192.0.2.1:1", "garbage", ""} {
		got, err := kf(request(remoteAddr))
		if err != nil || got != "global" {
			t.Errorf("RemoteAddr %q: got %q, %v; want \"global\", nil", remoteAddr, got, err)
		}
	}
	if kf, err := keyfuncs.Static(""); !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
		t.Errorf("Static(\"\") = %p, %v; want nil, an error wrapping ErrInvalidConfig", kf, err)
	}
}

// literal returns a KeyFunc that returns key.
func literal(key string) keyfuncs.KeyFunc {
	return func(*http.Request) (string, error) { return key, nil }
}

// splitJoined decodes a key of Join into its parts, or fails t.
func splitJoined(t *testing.T, key string) []string {
	t.Helper()
	var parts []string
	var cur []byte
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '\\':
			i++
			if i == len(key) || (key[i] != '\\' && key[i] != '|') {
				t.Fatalf("Join key %q: bad escape at %d", key, i-1)
			}
			cur = append(cur, key[i])
		case '|':
			parts = append(parts, string(cur))
			cur = cur[:0]
		default:
			cur = append(cur, c)
		}
	}
	return append(parts, string(cur))
}

func TestJoin(t *testing.T) {
	r := request("192.0.2.1:1")
	r.Header.Set("X-Api-Key", "secret")
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, "42"))

	tests := []struct {
		name  string
		parts []keyfuncs.KeyFunc
		want  string
	}{
		{"one part", []keyfuncs.KeyFunc{keyfuncs.PeerIP}, "ip:192.0.2.1"},
		{"ip and key", []keyfuncs.KeyFunc{keyfuncs.PeerIP, mustKey(keyfuncs.Header("X-Api-Key"))}, "ip:192.0.2.1|key:" + hash("secret")},
		{"user and static", []keyfuncs.KeyFunc{mustKey(keyfuncs.User(userFromContext)), mustKey(keyfuncs.Static("login"))}, "user:42|login"},
		{"separator escaped", []keyfuncs.KeyFunc{literal("a|b"), literal("c")}, `a\|b|c`},
		{"separator escaped second", []keyfuncs.KeyFunc{literal("a"), literal("b|c")}, `a|b\|c`},
		{"backslash escaped", []keyfuncs.KeyFunc{literal(`a\`), literal("b")}, `a\\|b`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mustKey(keyfuncs.Join(tt.parts...))(r)
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q, nil", got, err, tt.want)
			}
		})
	}
}

func TestJoinUnambiguous(t *testing.T) {
	tuples := [][]string{
		{"a|b", "c"}, {"a", "b|c"}, {"a", "b", "c"}, {"a|b|c"},
		{`a\`, "b"}, {"a", `\b`}, {`a\|b`}, {`a\`, `|b`}, {`a\\`, "b"},
		{`a\|`, "b"}, {"a", "|b"}, {"a|", "b"}, {"|", "|"}, {"||"}, {`\`, `\`}, {`\\`},
	}
	seen := map[string][]string{}
	for _, parts := range tuples {
		fns := make([]keyfuncs.KeyFunc, len(parts))
		for i, p := range parts {
			fns[i] = literal(p)
		}
		got, err := mustKey(keyfuncs.Join(fns...))(request("192.0.2.1:1"))
		if err != nil {
			t.Fatalf("Join(%q): %v", parts, err)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("Join(%q) and Join(%q) both got %q", prev, parts, got)
		}
		seen[got] = parts
		if back := splitJoined(t, got); strings.Join(back, "\x00") != strings.Join(parts, "\x00") || len(back) != len(parts) {
			t.Errorf("Join(%q) = %q, which decodes to %q", parts, got, back)
		}
	}
}

func TestJoinErrors(t *testing.T) {
	r := request("192.0.2.1:1") // no X-Api-Key
	errBoom := errors.New("boom")
	called := false
	after := func(*http.Request) (string, error) { called = true; return "x", nil }

	tests := []struct {
		name     string
		parts    []keyfuncs.KeyFunc
		sentinel error
		mention  string
	}{
		{"part 1 has no key", []keyfuncs.KeyFunc{keyfuncs.PeerIP, mustKey(keyfuncs.Header("X-Api-Key")), after}, keyfuncs.ErrNoKey, "part 1"},
		{"part 0 has no key", []keyfuncs.KeyFunc{mustKey(keyfuncs.Header("X-Api-Key")), keyfuncs.PeerIP}, keyfuncs.ErrNoKey, "part 0"},
		{"other error", []keyfuncs.KeyFunc{keyfuncs.PeerIP, func(*http.Request) (string, error) { return "", errBoom }}, errBoom, "part 1"},
		{"empty key", []keyfuncs.KeyFunc{keyfuncs.PeerIP, literal("")}, keyfuncs.ErrNoKey, "part 1"},
		{"no functions", nil, keyfuncs.ErrInvalidConfig, "at least one"},
		{"nil function", []keyfuncs.KeyFunc{keyfuncs.PeerIP, nil}, keyfuncs.ErrInvalidConfig, "part 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called = false
			kf, err := keyfuncs.Join(tt.parts...)
			got := ""
			if err == nil {
				got, err = kf(r)
			}
			if !errors.Is(err, tt.sentinel) || got != "" {
				t.Fatalf("got %q, %v; want \"\", an error wrapping %v", got, err, tt.sentinel)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("error %q does not mention %q", err, tt.mention)
			}
			if called {
				t.Errorf("a part after the failing one was called")
			}
		})
	}
}

func TestJoinCopiesItsArguments(t *testing.T) {
	fns := []keyfuncs.KeyFunc{literal("a"), literal("b")}
	kf := mustKey(keyfuncs.Join(fns...))
	fns[0] = literal("changed")
	if got, err := kf(request("192.0.2.1:1")); err != nil || got != "a|b" {
		t.Errorf("got %q, %v; want \"a|b\", nil", got, err)
	}
}

// FuzzJoin checks that Join's keys decode back to their parts, so that
// different tuples never share a key.
func FuzzJoin(f *testing.F) {
	f.Add("a|b", "c", "a")
	f.Add(`a\`, "|b", `\`)
	f.Add("", "x", "y")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		r := request("192.0.2.1:1")
		for _, parts := range [][]string{{a}, {a, b}, {a, b, c}, {c, b, a}} {
			fns := make([]keyfuncs.KeyFunc, len(parts))
			empty := false
			for i, p := range parts {
				fns[i] = literal(p)
				empty = empty || p == ""
			}
			key, err := mustKey(keyfuncs.Join(fns...))(r)
			if empty {
				if !errors.Is(err, keyfuncs.ErrNoKey) {
					t.Fatalf("Join(%q) = %q, %v; want an error wrapping ErrNoKey", parts, key, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("Join(%q): %v", parts, err)
			}
			back := splitJoined(t, key)
			if len(back) != len(parts) {
				t.Fatalf("Join(%q) = %q, which decodes to %q", parts, key, back)
			}
			for i := range back {
				if back[i] != parts[i] {
					t.Fatalf("Join(%q) = %q, which decodes to %q", parts, key, back)
				}
			}
		}
	})
}

func BenchmarkKeyFuncs(b *testing.B) {
	r := request("192.0.2.1:54321")
	r.Header.Set("X-Api-Key", "sk_live_0123456789abcdef0123456789abcdef")
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, "user-1234567"))
	r.Pattern = "GET /items/{id}"
	for _, bc := range []struct {
		name string
		kf   keyfuncs.KeyFunc
	}{
		{"Header", mustKey(keyfuncs.Header("X-Api-Key"))},
		{"User", mustKey(keyfuncs.User(userFromContext))},
		{"Pattern", keyfuncs.Pattern},
		{"Join(User,Pattern)", mustKey(keyfuncs.Join(mustKey(keyfuncs.User(userFromContext)), keyfuncs.Pattern))},
		{"Static", mustKey(keyfuncs.Static("global"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.kf(r)
				}
			})
		})
	}
}

// Constructors given bad arguments return an error, never a KeyFunc.
func TestConstructorErrors(t *testing.T) {
	for name, build := range map[string]func() (keyfuncs.KeyFunc, error){
		"Header(bad name)": func() (keyfuncs.KeyFunc, error) { return keyfuncs.Header("bad name") },
		"Static(empty)":    func() (keyfuncs.KeyFunc, error) { return keyfuncs.Static("") },
		"User(nil)":        func() (keyfuncs.KeyFunc, error) { return keyfuncs.User(nil) },
		"Route(nil)":       func() (keyfuncs.KeyFunc, error) { return keyfuncs.Route(nil) },
		"Join()":           func() (keyfuncs.KeyFunc, error) { return keyfuncs.Join() },
		"Join(nil)":        func() (keyfuncs.KeyFunc, error) { return keyfuncs.Join(keyfuncs.PeerIP, nil) },
	} {
		if kf, err := build(); !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
			t.Errorf("%s = %p, %v; want nil, an error wrapping ErrInvalidConfig", name, kf, err)
		}
	}
}

// The key functions that resolve the client behind trusted proxies record
// its address in the request's slot, however they are called (alone, in a
// Join, in a function of the app's own); the others leave it empty, so the
// allow-list never trusts text that only looks like "ip:…".
func TestAddressSlot(t *testing.T) {
	clientIP, _ := keyfuncs.ClientIP(keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor())
	fromCtx, _ := keyfuncs.ClientIPFromContext(func(context.Context) string { return "198.51.100.7" })
	wrapped := func(r *http.Request) (string, error) { k, err := clientIP(r); return "tenant:" + k, err }
	r := request("10.0.0.1:1")
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	for name, fn := range map[string]keyfuncs.KeyFunc{
		"ClientIP": clientIP, "ClientIPFromContext": fromCtx, "their own wrapper": wrapped,
		"Join(Header, ClientIP)": mustKey(keyfuncs.Join(mustKey(keyfuncs.Static("x")), clientIP)),
	} {
		var slot netip.Addr
		if _, err := fn(r.WithContext(keyfuncs.WithAddressSlot(r.Context(), &slot))); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if slot != netip.MustParseAddr("198.51.100.7") {
			t.Errorf("%s recorded %v, want 198.51.100.7", name, slot)
		}
	}
	for name, fn := range map[string]keyfuncs.KeyFunc{
		"PeerIP": keyfuncs.PeerIP, "Static": mustKey(keyfuncs.Static("ip:198.51.100.7")),
		"their own": func(*http.Request) (string, error) { return "ip:198.51.100.7", nil },
	} {
		var slot netip.Addr
		fn(r.WithContext(keyfuncs.WithAddressSlot(r.Context(), &slot)))
		if slot.IsValid() {
			t.Errorf("%s recorded %v, want nothing (the peer)", name, slot)
		}
	}
	if _, err := clientIP(r); err != nil { // no slot: nothing to record
		t.Error(err)
	}
}

// mustKey returns kf, failing the process on err: for KeyFuncs built from
// arguments known to be good.
func mustKey(kf keyfuncs.KeyFunc, err error) keyfuncs.KeyFunc {
	if err != nil {
		panic(err)
	}
	return kf
}
