package middleware_test

import (
	"log"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/keyfuncs"
	tollgate "github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

func handleLogin(w http.ResponseWriter, r *http.Request) {}
func listItems(w http.ResponseWriter, r *http.Request)   {}

// The README's quickstart: two route groups of a chi router, each behind
// its own limiter, sharing one Redis. (Compiled, not run: it needs a Redis;
// TestReadmeQuickstart keeps the README's copy the same.)
func ExampleNew_chi() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true,
		DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond,
		WriteTimeout: 100 * time.Millisecond, PoolTimeout: 100 * time.Millisecond})
	st := store.NewRedis(rdb)

	// The client behind your load balancer (here: proxies in 10.0.0.0/8), not the balancer:
	// keyfuncs.PeerIP, the default, would put every client in the balancer's bucket.
	client, err := keyfuncs.ClientIP(keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor())
	if err != nil {
		log.Fatal(err)
	}
	login, err := tollgate.New(st, store.PerMinute(5), tollgate.WithName("login"), tollgate.WithKeyFunc(client),
		tollgate.WithFailurePolicy(tollgate.FailClosed)) // Redis down: refuse logins
	if err != nil {
		log.Fatal(err)
	}
	api, err := tollgate.New(st, store.PerMinute(100), tollgate.WithName("api"), tollgate.WithKeyFunc(client)) // Redis down: local limits
	if err != nil {
		log.Fatal(err)
	}

	r := chi.NewRouter()
	r.With(login.Handler).Post("/login", handleLogin)
	r.Route("/api", func(r chi.Router) { r.Use(api.Handler); r.Get("/items", listItems) })
	log.Fatal(http.ListenAndServe(":8080", r))
}
