module github.com/tollgate-go/tollgate

go 1.23.0

require (
	github.com/alicebob/miniredis/v2 v2.34.0
	github.com/go-chi/chi/v5 v5.2.3
	github.com/go-chi/httprate v0.15.0
	github.com/gorilla/mux v1.8.1
	github.com/redis/go-redis/v9 v9.7.3
	golang.org/x/time v0.9.0
)

require (
	github.com/alicebob/gopher-json v0.0.0-20230218143504-906a9b012302 // indirect
	github.com/cespare/xxhash/v2 v2.2.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	github.com/zeebo/xxh3 v1.0.2 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
