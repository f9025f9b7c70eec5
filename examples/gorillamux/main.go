// Command gorillamux shows tollgate on a gorilla/mux router: a limiter
// registered with router.Use for every route, and an /api subrouter with a
// limit of its own.
//
//   - Every route: 100 per minute per client IP (router.Use).
//   - /api/...: also 10 per minute per API key, read from the X-API-Key
//     header (stored hashed, never as the secret itself). A request without
//     a key is answered 401 by the key-error handler. The key is not checked
//     here, so a client could invent keys; the per-IP limit still holds it.
//
// gorilla/mux runs middleware only for a request that matched a route, the
// router's first and then the subrouter's, so /api responses carry both
// limits and a 404 is not counted.
//
// Run it against Redis at REDIS_ADDR, or, when that is unset, against an
// embedded miniredis:
//
//	go run ./examples/gorillamux
//
// Then, in another terminal:
//
//	curl -i http://127.0.0.1:8080/
//	curl -i -H 'X-API-Key: secret-1' http://127.0.0.1:8080/api/reports/7
//	curl -i http://127.0.0.1:8080/api/reports/7   # 401: no API key
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gorilla/mux"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
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

// newRouter builds the application: a router behind the per-IP limiter,
// with an /api subrouter behind the per-key limiter too, all deciding on st.
func newRouter(st store.Store) (http.Handler, error) {
	perIP, err := middleware.New(st, store.PerMinute(100), middleware.WithName("ip"))
	if err != nil {
		return nil, err
	}
	byKey, err := keyfuncs.Header("X-API-Key")
	if err != nil {
		return nil, err
	}
	perKey, err := middleware.New(st, store.PerMinute(10),
		middleware.WithName("apikey"),
		middleware.WithKeyFunc(byKey),
		middleware.WithKeyErrorHandler(keyError),
	)
	if err != nil {
		return nil, err
	}

	r := mux.NewRouter()
	r.Use(perIP.Handler)
	r.HandleFunc("/", home).Methods(http.MethodGet)

	api := r.PathPrefix("/api").Subrouter()
	api.Use(perKey.Handler)
	api.HandleFunc("/reports/{id}", getReport).Methods(http.MethodGet)
	return r, nil
}

// keyError answers a request the per-key limiter cannot rate. Without an
// API key that is the client's to fix: 401.
func keyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, keyfuncs.ErrNoKey) {
		w.Header().Set("WWW-Authenticate", `APIKey header="X-API-Key"`)
		http.Error(w, "401 Unauthorized: send your API key in X-API-Key", http.StatusUnauthorized)
		return
	}
	log.Printf("rate limiter: %v", err) // may hold the key: log it, never send it
	http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
}

func home(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, "home")
}

func getReport(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "report %s\n", mux.Vars(r)["id"])
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
// limiter, which must answer within a few milliseconds or not at all (see
// examples/chi for the reasons).
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
