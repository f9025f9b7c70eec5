package tollgate_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// A limiter of 2 requests per minute per client address, on the in-process
// store (store.NewRedis shares it across servers), in front of a handler.
func Example() {
	st := store.NewMemory()
	defer st.Close()
	lim, err := middleware.New(st, store.PerMinute(2), middleware.WithName("api"))
	if err != nil {
		panic(err) // an invalid limit or option, named
	}
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		line := fmt.Sprint(w.Code, " RateLimit: ", w.Header().Get("RateLimit"))
		if ra := w.Header().Get("Retry-After"); ra != "" {
			line += " Retry-After: " + ra
		}
		fmt.Println(line)
	}
	// Output:
	// 200 RateLimit: "api";r=1;t=30
	// 200 RateLimit: "api";r=0;t=30
	// 429 RateLimit: "api";r=0;t=30 Retry-After: 30
}
