# tollgate's one test command is `make test`: it is what CI runs (.ci/run).

GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT   := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
PKGS        := ./...
BENCHCOUNT  ?= 6
BENCHTIME   ?= 1s
# The core is built and tested as a user gets it, alone; promobserver and
# otelobserver through go.work, which puts this tree in place of the core
# version they require until it is tagged.
export GOWORK := off
WORK        := GOWORK=$(CURDIR)/go.work

.PHONY: test test-unit redis fmt vet lint race allocs submodules bench benchstat fuzz test-faults

## test: everything CI runs — formatting, vet, staticcheck, the race-enabled
## tests, which start real redis-server processes (a single node and a Cluster),
## and the allocation tests without the race detector;
## the same for the promobserver module, and vet for the bench module (its
## benchmarks run with `make bench-peers`). Without redis-server it fails,
## saying how to install it (REDIS_ADDR=host:port uses a server you run).
test: redis fmt vet lint race allocs submodules

## test-unit: the same without Redis: the tests that need a real redis-server
## skip (on miniredis the unit tests still cover the Redis store).
test-unit: fmt vet lint allocs
	TOLLGATE_UNIT=1 $(GO) test -race -count=1 -timeout 10m $(PKGS)
	cd promobserver && $(WORK) $(GO) vet ./... && $(WORK) $(GO) test -race -count=1 ./...

redis:
	@if [ -z "$$REDIS_ADDR" ] && ! { command -v redis-server && command -v redis-cli; } >/dev/null 2>&1; then \
		echo "make test needs redis-server and redis-cli on the PATH: install them (Debian: apt-get install -y redis-server; macOS: brew install redis), or set REDIS_ADDR=host:port; make test-unit runs the unit tests alone" >&2; \
		exit 1; \
	fi

submodules:
	cd promobserver && $(WORK) $(GO) vet ./... && $(WORK) $(GO) run $(STATICCHECK) ./... && $(WORK) $(GO) test -race -count=1 ./...
	cd otelobserver && $(WORK) $(GO) vet ./... && $(WORK) $(GO) run $(STATICCHECK) ./... && $(WORK) $(GO) test -race -count=1 ./...
	cd bench && $(GO) vet ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

lint:
	$(GO) run $(STATICCHECK) $(PKGS)

race:
	$(GO) test -race -count=1 -timeout 10m $(PKGS)

## allocs: the allocation tests, which the race detector skips (it
## allocates where the code does not).
ALLOCTESTS := Alloc|TestAppendPeerIP
allocs:
	$(GO) test -count=1 -run '$(ALLOCTESTS)' ./middleware ./headers ./keyfuncs ./store
	cd promobserver && $(WORK) $(GO) test -count=1 -run '$(ALLOCTESTS)' ./...

## bench: the benchmarks, BENCHCOUNT runs each, into bench.out (benchstat-ready).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCHCOUNT) -benchtime $(BENCHTIME) $(PKGS) | tee bench.out

benchstat: bench
	$(GO) run $(BENCHSTAT) bench.out

## bench-peers: tollgate side by side with its peers (bench/, a module of its
## own, so that the peers the library does not otherwise need stay out of its
## go.mod), against a redis-server it
## starts; writes BENCHMARKS.md. About 7 minutes on 2 cores.
.PHONY: bench-peers
bench-peers:
	cd bench && $(GO) run ./cmd/report -go $(GO) -out ../BENCHMARKS.md

## fuzz: a short run of each fuzz target (FUZZTIME each).
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzTake$$' -fuzztime $(FUZZTIME) ./store
	$(GO) test -run '^$$' -fuzz '^FuzzPeerIP$$' -fuzztime $(FUZZTIME) ./keyfuncs
	$(GO) test -run '^$$' -fuzz '^FuzzJoin$$' -fuzztime $(FUZZTIME) ./keyfuncs
	$(GO) test -run '^$$' -fuzz '^FuzzClientIP$$' -fuzztime $(FUZZTIME) ./keyfuncs
	$(GO) test -run '^$$' -fuzz '^FuzzWrite$$' -fuzztime $(FUZZTIME) ./headers
	$(GO) test -run '^$$' -fuzz '^FuzzParseList$$' -fuzztime $(FUZZTIME) ./headers

## test-faults: the fault tests alone (real redis-server processes killed,
## stopped and failed over); they also run in `make test`.
test-faults:
	$(GO) test -race -count=1 -run 'TestFault|TestRedisHung|TestFailLocal|TestBreaker|TestStoreFailure' -v . ./middleware
