// Command chi shows tollgate on a chi router, with a different limit for
// each route group, all shared through one Redis store:
//
//   - POST /login: 5 per minute per client IP, failing closed (503) when
//     Redis cannot answer: a login form must not go unlimited.
//   - /api/...: 100 per minute per client IP, falling back to local
//     per-server limits (FailLocal, the default) when Redis is down: an
//     ordinary API keeps serving, still limited.
//   - /me/...: 60 per minute per authenticated user, after an auth middleware
//     that puts the user id in the request context.
//
// Run it against Redis at REDIS_ADDR, or, when that is unset, against an
// embedded miniredis:
//
//	go run ./examples/chi
//	REDIS_ADDR=localhost:6379 go run ./examples/chi
//
// Then, in another terminal:
//
//	curl -i -X POST http://127.0.0.1:8080/login    # the 6th within a minute gets 429
//	curl -i http://127.0.0.1:8080/api/items/42
//	curl -i -H 'Authorization: Bearer alice' http://127.0.0.1:8080/me
//	curl -i http://127.0.0.1:8080/me               # 401: no user, no bucket
//
// chi's middleware package and tollgate's share a name. This example keeps
// chi's as "middleware", as existing chi code has it, and imports tollgate's
// as "tollgate".
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/keyfuncs"
	tollgate "github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()

	st, err := openStore(os.Getenv("REDIS_ADDR"))
	if err != nil {
		log.Fatal(err)
	}
	router, err := newRouter(st)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: router, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("listening on http://%s", *addr)
	log.Fatal(srv.ListenAndServe())
}

// newRouter builds the application: its routes, each group behind its own
// limiter, all deciding on st.
func newRouter(st store.Store) (http.Handler, error) {
	// The store key of a bucket is "<name>:<subject>": the name keeps the
	// login and API buckets of one IP apart.
	login, err := tollgate.New(st, store.PerMinute(5),
		tollgate.WithName("login"),
		tollgate.WithFailurePolicy(tollgate.FailClosed), // 503 + Retry-After when Redis is down
	)
	if err != nil {
		return nil, err
	}
	api, err := tollgate.New(st, store.PerMinute(100),
		tollgate.WithName("api"),
		tollgate.WithFailurePolicy(tollgate.FailLocal), // the default, spelled out
	)
	if err != nil {
		return nil, err
	}
	byUser, err := keyfuncs.User(userID)
	if err != nil {
		return nil, err
	}
	perUser, err := tollgate.New(st, store.PerMinute(60),
		tollgate.WithName("user"),
		tollgate.WithKeyFunc(byUser),
	)
	if err != nil {
		return nil, err
	}

	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Use(middleware.Heartbeat("/healthz")) // answered before any limiter
	// The limiters key by keyfuncs.PeerIP, the TCP peer. Do not put
	// middleware.RealIP in front of them: it trusts X-Forwarded-For from
	// anyone, so every client could pick its own bucket.

	r.Group(func(r chi.Router) {
		r.Use(login.Handler)
		r.Post("/login", handleLogin)
	})

	r.Route("/api", func(r chi.Router) {
		r.Use(api.Handler)
		r.Get("/items", listItems)
		r.Get("/items/{id}", getItem)
	})

	r.Route("/me", func(r chi.Router) {
		// authenticate runs first: a request without a user gets its 401
		// there and never reaches the per-user limiter. (Limit such
		// requests per IP in front of it if guessing tokens is a concern.)
		r.Use(authenticate)
		r.Use(perUser.Handler)
		r.Get("/", me)
		r.Get("/orders", myOrders)
	})
	return r, nil
}

type userKey struct{}

// authenticate is demo-grade authentication: "Authorization: Bearer <user>"
// makes the request <user>'s. A real app verifies a token here.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || user == "" {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "401 Unauthorized: send Authorization: Bearer <user>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// userID returns the user that authenticate put in ctx, or "".
func userID(ctx context.Context) string {
	user, _ := ctx.Value(userKey{}).(string)
	return user
}

func handleLogin(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, "logged in (not really: this is a demo)")
}

func listItems(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, "items: 1 2 3")
}

func getItem(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "item %s\n", chi.URLParam(r, "id"))
}

func me(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "hello, %s\n", userID(r.Context()))
}

func myOrders(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "orders of %s: none\n", userID(r.Context()))
}

// openStore returns a Redis store on the server at addr or, when addr is
// empty, on an embedded miniredis that lives as long as the process.
func openStore(addr string) (store.Store, error) {
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, err
		}
		addr = mr.Addr()
		log.Printf("REDIS_ADDR is not set: using an embedded miniredis at %s", addr)
	} else {
		log.Printf("using Redis at %s", addr)
	}
	return store.NewRedis(newRedisClient(addr)), nil
}

// newRedisClient returns a go-redis client with timeouts fit for a rate
// limiter, which must answer within a few milliseconds or not at all. The
// go-redis defaults (5s to dial, 3s to read or write) would let a dead Redis
// hold requests for seconds; with ContextTimeoutEnabled, which the store
// requires (middleware.New refuses a client without it), the client also
// stops at the limiter's budget (middleware.WithTimeout, 100ms by default),
// and the failure policy decides.
//
// go-redis also retries a failed command (MaxRetries, 3 by default, with
// backoff): while Redis refuses connections that spends most of the budget
// on every request. MaxRetries: -1 turns retries off, at the price of
// failing a decision on a single network blip. With retries on, the store
// ends a call whose reply is later than ReadTimeout or WriteTimeout (a copy
// sent then would be taken too), so they are the budget here: 100ms each. A
// copy sent after a connection dropped mid-call can still be taken twice;
// MaxRetries: -1 rules that out too.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		PoolTimeout:           100 * time.Millisecond,
		ContextTimeoutEnabled: true,
	})
}
