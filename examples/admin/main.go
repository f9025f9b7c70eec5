// Command admin serves an API behind a tollgate limiter and, on a second
// port, the operator endpoints of its buckets:
//
//	GET    /buckets/{subject}              what the bucket holds (store.Inspect)
//	DELETE /buckets/{subject}              reset it: full again, a quota's count gone (store.Admin)
//	POST   /buckets/{subject}?block=10m    refuse the subject for 10 minutes
//
// where subject is what the limiter's key function returns, such as
// ip:192.0.2.1.
//
// THE ADMIN HANDLER HAS NO AUTHENTICATION OF ITS OWN. Whoever reaches it can
// unblock an abuser or lock out a customer: serve it only behind your own
// authentication, on an internal address, as this program does on loopback.
//
//	go run ./examples/admin
//	curl -i http://127.0.0.1:8080/
//	curl http://127.0.0.1:8081/buckets/ip:127.0.0.1
//	curl -X POST 'http://127.0.0.1:8081/buckets/ip:127.0.0.1?block=1m'
package main

import (
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// Store is what the admin handler needs: tollgate's Memory and Redis stores.
type Store interface {
	store.Store
	store.Admin
}

// adminHandler serves the operator endpoints of lim's buckets on st.
// Authentication is the caller's: see the package doc.
func adminHandler(st Store, lim *middleware.Limiter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /buckets/{subject...}", func(w http.ResponseWriter, r *http.Request) {
		res, err := store.Inspect(r.Context(), st, lim.StoreKey(r.PathValue("subject")), lim.Limit(), 1)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"limit": lim.Limit().String(), "remaining": res.Remaining, "allowed": res.Allowed,
			"retry_after": res.RetryAfter.String(), "reset_after": res.ResetAfter.String(),
		})
	})
	mux.HandleFunc("DELETE /buckets/{subject...}", func(w http.ResponseWriter, r *http.Request) {
		if err := st.Reset(r.Context(), lim.StoreKey(r.PathValue("subject")), lim.Limit()); err != nil { // a quota's count too
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		lim.Forget(r.PathValue("subject")) // this server's deny cache, if it has one
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /buckets/{subject...}", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("block"))
		if err != nil || d <= 0 {
			http.Error(w, "block: a positive duration, such as 10m", http.StatusBadRequest)
			return
		}
		err = st.Block(r.Context(), lim.StoreKey(r.PathValue("subject")), lim.Limit(), d)
		switch {
		case errors.Is(err, store.ErrInvalidLimit) || errors.Is(err, store.ErrBlockTooLong):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadGateway)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	return mux
}

func main() {
	st := store.NewMemory()
	defer st.Close()
	lim, err := middleware.New(st, store.PerMinute(30), middleware.WithName("api"))
	if err != nil {
		log.Fatal(err)
	}
	api := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }))
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:8081", adminHandler(st, lim))) }() // loopback only: no authentication
	log.Printf("API on http://127.0.0.1:8080/, operator endpoints on http://127.0.0.1:8081/buckets/{subject}")
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", api))
}
