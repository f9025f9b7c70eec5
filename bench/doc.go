// Package bench measures tollgate side by side with its peers, in the same
// run, on the same machine. It is a module of its own so that the peer
// libraries never enter tollgate's go.mod.
//
// # Layout
//
//   - peers: tollgate, go-chi/httprate (+ httprate-redis), ulule/limiter,
//     go-redis/redis_rate, throttled, sethvargo/go-limiter and x/time/rate
//     behind one interface, at the decision level and as net/http middleware.
//   - decide_test.go: BenchmarkDecide/<backend>/<lib>/<workload>/g<goroutines>,
//     decisions per second and allocations per decision (benchstat-ready).
//   - cmd/server: one library as middleware on a net/http server.
//   - cmd/load: a keep-alive HTTP load generator (requests/s, p50/p99, 200s
//     and 429s), run as a separate process.
//   - cmd/luaexp: Redis's time inside two versions of the script, per Take.
//   - cmd/report: runs everything against a redis-server it starts and
//     writes BENCHMARKS.md (make bench-peers).
//
// # Running
//
//	go run ./cmd/report -out ../BENCHMARKS.md            # everything, about 8 minutes on 2 cores
//	go test -run '^$' -bench 'Decide/memory' -benchmem .  # one part; starts its own redis-server for redis
package bench
