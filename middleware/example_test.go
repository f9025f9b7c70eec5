package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

func ExampleNew() {
	st := store.NewMemory() // store.NewRedis(rdb) to share the limit across servers
	defer st.Close()

	lim, err := middleware.New(st, store.Limit{Rate: 2, Period: time.Minute, Burst: 2},
		middleware.WithName("api"))
	if err != nil {
		panic(err)
	}
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for i := 1; i <= 3; i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		fmt.Printf("%d %s | RateLimit: %s | Retry-After: %q\n",
			w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "api";q=2;w=60 | RateLimit: "api";r=1;t=30 | Retry-After: ""
	// 200 "api";q=2;w=60 | RateLimit: "api";r=0;t=30 | Retry-After: ""
	// 429 "api";q=2;w=60 | RateLimit: "api";r=0;t=30 | Retry-After: "30"
}
