package storetest_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/store"
	"github.com/tollgate-go/tollgate/storetest"
)

// A store of your own runs the suite from a test of its package, as
// tollgate's stores do; here store.Memory on a controlled clock, so that
// every duration is checked to the microsecond. Without Advance the suite
// sleeps and checks within Slack, as for a store on a server's clock.
func ExampleRun() {
	var _ = func(t *testing.T) { // a test function: go test runs it
		now := time.Unix(1_700_000_000, 0)
		storetest.Run(t, storetest.Harness{
			New: func(t *testing.T) store.Store {
				m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
				t.Cleanup(func() { m.Close() })
				return m
			},
			Advance: func(d time.Duration) { now = now.Add(d) },
		})
	}
}
