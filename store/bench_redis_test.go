package store_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/store"
)

// BenchmarkRedisTake decides on a real redis-server started for the
// benchmark, from 1 goroutine and from 64, with batching (the default,
// DefaultBatchPipelines in flight, and 4), with 1 pipeline in flight, and
// without batching.
func BenchmarkRedisTake(b *testing.B) {
	srv := redistest.Server(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	for _, v := range []struct {
		name string
		n    int
	}{{"batch=default", store.DefaultBatchPipelines}, {"batch=4", 4}, {"batch=1", 1}, {"batch=off", 0}} {
		s := store.NewRedis(client, store.WithBatching(v.n))
		if _, err := s.Take(ctx, "warm", benchLimit, 1); err != nil {
			b.Fatal(err)
		}
		b.Run(v.name+"/goroutines=1", func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				if _, err := s.Take(ctx, spreadKeys[i%len(spreadKeys)], benchLimit, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(v.name+"/goroutines=64", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine from its own offset: goroutines walking the
				// keys in step would decide on one bucket at once, which
				// measures Redis on a few hot keys.
				i := int(next.Add(1)) * (len(spreadKeys) / 64)
				for pb.Next() {
					if _, err := s.Take(ctx, spreadKeys[i%len(spreadKeys)], benchLimit, 1); err != nil {
						b.Error(err)
						return
					}
					i += 7
				}
			})
		})
	}
}
