package store_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/store"
)

func ExampleMemory() {
	m := store.NewMemory()
	defer m.Close()

	lim := store.PerMinute(3) // 3 per minute, bursts of 3
	for i := range 4 {
		r, err := m.Take(context.Background(), "user:42", lim, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed=%v remaining=%d retry after ~%v\n",
			i+1, r.Allowed, r.Remaining, r.RetryAfter.Round(time.Second))
	}
	// Output:
	// request 1: allowed=true remaining=2 retry after ~0s
	// request 2: allowed=true remaining=1 retry after ~0s
	// request 3: allowed=true remaining=0 retry after ~0s
	// request 4: allowed=false remaining=0 retry after ~20s
}

func ExampleRedis() {
	// An embedded miniredis stands in for a real server here.
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()

	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	s := store.NewRedis(rdb, store.WithKeyPrefix("myapp:"))

	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 20}
	r, err := s.Take(context.Background(), "api:key-123", lim, 5)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Allowed, r.Remaining, r.ResetAfter, s.Key("api:key-123"))
	// Output:
	// true 15 500ms myapp:api:key-123
}
