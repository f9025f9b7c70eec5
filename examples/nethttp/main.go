// Command nethttp shows tollgate with the standard library's router,
// http.ServeMux and its method and wildcard patterns (Go 1.22+), with two
// limiters:
//
//   - per client IP, 100 per minute, wrapped around the whole mux;
//   - per route, 20 per minute for each pattern ("GET /items/{id}",
//     "POST /items"), shared by all clients: a budget that protects what is
//     behind the route. It keys by keyfuncs.Pattern, which reads
//     Request.Pattern, and the mux sets that only when it has routed the
//     request: so this limiter wraps each handler registered in the mux,
//     not the mux.
//
// A response carries the headers of both limiters, one list item each:
//
//	RateLimit-Policy: "ip";q=100;w=60, "route";q=20;w=60
//	RateLimit: "ip";r=99;t=1, "route";r=19;t=3
//
// Run it against Redis at REDIS_ADDR, or, when that is unset, against an
// embedded miniredis:
//
//	go run ./examples/nethttp
//
// Then, in another terminal:
//
//	curl -i http://127.0.0.1:8080/items/42
//	curl -i -X POST http://127.0.0.1:8080/items
//	for i in $(seq 22); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:8080/items/$i; done
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
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
	h, err := newHandler(st)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("listening on http://%s", *addr)
	log.Fatal(srv.ListenAndServe())
}

// newHandler builds the application: a ServeMux whose handlers are each
// behind the per-route limiter, the whole behind the per-IP limiter, all
// deciding on st.
func newHandler(st store.Store) (http.Handler, error) {
	perIP, err := middleware.New(st, store.PerMinute(100),
		middleware.WithName("ip"), // keyfuncs.PeerIP is the default KeyFunc
	)
	if err != nil {
		return nil, err
	}
	perRoute, err := middleware.New(st, store.PerMinute(20),
		middleware.WithName("route"),
		middleware.WithKeyFunc(keyfuncs.Pattern), // "route:GET /items/{id}"
	)
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", perRoute.Handler(http.HandlerFunc(getItem)))
	mux.Handle("POST /items", perRoute.Handler(http.HandlerFunc(createItem)))
	mux.HandleFunc("GET /healthz", healthz) // limited per IP only
	return perIP.Handler(mux), nil
}

func getItem(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "item %s\n", r.PathValue("id"))
}

func createItem(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintln(w, "created")
}

func healthz(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, "ok")
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
