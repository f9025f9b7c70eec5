package store_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/internal/storetest"
	"github.com/tollgate-go/tollgate/store"
)

func TestConformanceRedisServer(t *testing.T) {
	t.Parallel()
	client := redistest.Server(t).Client(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(client) },
		Slack: 50 * time.Millisecond,
	})
}

func TestConformanceRedisCluster(t *testing.T) {
	t.Parallel()
	client := redistest.Cluster(t).Client(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) store.Store { return store.NewRedis(client) },
		Slack: 50 * time.Millisecond,
	})
}
