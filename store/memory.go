package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	_ "unsafe" // for go:linkname
)

// DefaultMaxKeys is the number of live buckets a [Memory] store holds at
// most unless [WithMaxKeys] says otherwise. A bucket costs about 100 bytes
// plus its key.
const DefaultMaxKeys = 1_000_000

// DefaultSweepInterval is how often a [Memory] store's background sweeper
// drops buckets that are full again, unless [WithSweepInterval] says
// otherwise.
const DefaultSweepInterval = 10 * time.Second

const maxShards = 64

// Memory is a [Store] that keeps buckets in this process, on the process's
// monotonic clock, with the same semantics as [Redis]. It serves single
// servers, tests, and degraded mode when Redis is unreachable.
//
// Buckets live in shards, each under its own lock, so decisions on different
// keys rarely contend. The store is bounded: buckets that are full again are
// dropped (incrementally, by a background sweeper and whenever a shard is at
// capacity), and no more than MaxKeys buckets live at once. When a flood of
// distinct keys fills a shard, the sampled bucket nearest to full is
// forgotten to make room, which can only loosen a limit, never tighten it.
//
// Memory is safe for concurrent use. Its zero value is not usable; call
// [NewMemory], and [Memory.Close] when done to stop the sweeper.
type Memory struct {
	shards   []memShard
	mask     uint32
	shardCap int
	clock    func() time.Time // nil: the monotonic clock below
	start    time.Time
	startUs  int64
	startNs  int64 // nanotime() at start
	evicted  atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type memShard struct {
	mu     sync.Mutex
	m      map[string]*bucket // pointers: an update is one map lookup, not two
	cached bool               // limit and params hold the last valid Limit seen
	limit  Limit
	params params
	_      [64]byte // keep shards on separate cache lines
}

// MemoryOption configures a [Memory] store.
type MemoryOption func(*memoryConfig)

type memoryConfig struct {
	maxKeys int
	sweep   time.Duration
	clock   func() time.Time
}

// WithMaxKeys caps the number of live buckets at n (default
// [DefaultMaxKeys]). A value below 1 selects the default.
func WithMaxKeys(n int) MemoryOption {
	return func(c *memoryConfig) {
		if n >= 1 {
			c.maxKeys = n
		}
	}
}

// WithSweepInterval sets how often the background sweeper drops buckets that
// are full again (default [DefaultSweepInterval]). A value of 0 or below
// starts no sweeper: buckets are then dropped only when a shard is at
// capacity or a bucket is read after it refilled.
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(c *memoryConfig) { c.sweep = d }
}

// WithClock makes the store read the time from now instead of the process's
// monotonic clock, for tests that control time. The clock should not go
// backwards; if it does, buckets simply refill later.
func WithClock(now func() time.Time) MemoryOption {
	return func(c *memoryConfig) { c.clock = now }
}

// NewMemory returns a Memory store. Unless [WithSweepInterval] disables it,
// it starts one goroutine, which [Memory.Close] stops.
func NewMemory(opts ...MemoryOption) *Memory {
	cfg := memoryConfig{maxKeys: DefaultMaxKeys, sweep: DefaultSweepInterval}
	for _, o := range opts {
		o(&cfg)
	}
	n := maxShards
	for n > 1 && cfg.maxKeys/n < 64 {
		n /= 2
	}
	m := &Memory{
		shards:   make([]memShard, n),
		mask:     uint32(n - 1),
		shardCap: cfg.maxKeys / n,
		clock:    cfg.clock,
		start:    time.Now(),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	m.startUs = m.start.UnixMicro()
	m.startNs = nanotime()
	for i := range m.shards {
		m.shards[i].m = make(map[string]*bucket)
	}
	if cfg.sweep > 0 {
		go m.sweepLoop(cfg.sweep)
	} else {
		close(m.done)
	}
	return m
}

// Take implements [Store]. It never blocks on I/O and ignores ctx, so it
// still decides when the caller's deadline has passed (as in degraded mode
// after a Redis timeout).
//
// Take keeps no reference to key once it returns (a key it stores is
// copied), so a caller may pass a string whose bytes it reuses afterwards.
func (m *Memory) Take(_ context.Context, key string, limit Limit, cost int) (Result, error) {
	if len(key) > maxKeyLen {
		key = hashKey(key)
	}
	now := m.nowUs() // read outside the lock: the clock is the slowest step
	sh := &m.shards[shardOf(key)&m.mask]
	sh.mu.Lock()
	// Each shard remembers the last Limit it validated, which saves the
	// divisions of Limit.params on nearly every call.
	if !sh.cached || limit != sh.limit {
		p, err := limit.params()
		if err != nil {
			sh.mu.Unlock()
			return Result{}, err
		}
		sh.limit, sh.params, sh.cached = limit, p, true
	}
	if cost < 0 || cost > limit.Burst {
		sh.mu.Unlock()
		return Result{}, costError(key, limit, cost)
	}
	res := Result{Limit: limit}
	m.decide(sh, key, now, cost, &res)
	return res, nil
}

// Refund implements [Refunder].
func (m *Memory) Refund(_ context.Context, key string, limit Limit, tokens int) (Result, error) {
	if err := limit.Validate(); err != nil {
		return Result{}, err
	}
	if tokens < 0 || tokens > limit.Burst {
		return Result{}, refundError(key, limit, tokens)
	}
	if len(key) > maxKeyLen {
		key = hashKey(key)
	}
	now := m.nowUs()
	sh := &m.shards[shardOf(key)&m.mask]
	sh.mu.Lock()
	if !sh.cached || limit != sh.limit {
		sh.limit, sh.params, sh.cached = limit, mustParams(limit), true
	}
	res := Result{Limit: limit}
	m.decide(sh, key, now, -tokens, &res)
	return res, nil
}

func mustParams(l Limit) params {
	p, _ := l.params() // validated by the caller
	return p
}

// decide runs one decision on shard sh, whose lock the caller holds and
// whose params are limit's; it unlocks sh.
func (m *Memory) decide(sh *memShard, key string, now int64, cost int, res *Result) {
	b, ok := sh.m[key]
	var cur bucket
	if ok {
		cur = *b
	}
	nb, write := sh.params.decide(res, cur, ok, now, int64(cost))
	switch {
	case write && ok:
		*b = nb
	case write:
		if len(sh.m) >= m.shardCap {
			m.evict(sh, now)
		}
		fresh := new(bucket) // allocated here only, so that nb stays on the stack
		*fresh = nb
		sh.m[strings.Clone(key)] = fresh // a clone: do not pin the caller's backing array
	case ok && res.ResetAfter == 0:
		delete(sh.m, key) // full again: a missing key is a full bucket
	}
	sh.mu.Unlock()
}

// evict makes room in a full shard: it samples a few buckets, drops those
// that are full again, and if there were none, the one nearest to full.
// The caller holds sh.mu.
func (m *Memory) evict(sh *memShard, now int64) {
	const samples = 16
	var victim string
	var victimTat int64
	freed, seen := 0, 0
	for k, b := range sh.m { // map iteration starts at a random entry
		if b.tat.u < now || (b.tat.u == now && b.tat.f == 0) {
			delete(sh.m, k)
			freed++
		} else if victim == "" || b.tat.u < victimTat {
			victim, victimTat = k, b.tat.u
		}
		if seen++; seen >= samples {
			break
		}
	}
	if freed == 0 && victim != "" {
		delete(sh.m, victim)
		m.evicted.Add(1)
	}
}

// Len returns the number of live buckets.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Evicted returns how many buckets that were not yet full have been
// forgotten to respect MaxKeys. A growing count means the cap is too low for
// the traffic (or the store is under a flood of distinct keys).
func (m *Memory) Evicted() int64 { return m.evicted.Load() }

// Close stops the background sweeper and waits for it to return. It is safe
// to call more than once and always returns nil. The store still decides
// after Close; it only stops sweeping in the background.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() { close(m.stop) })
	<-m.done
	return nil
}

func (m *Memory) sweepLoop(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweep()
		}
	}
}

// sweep drops every bucket that is full again, one shard at a time, letting
// go of the shard's lock every few entries so that requests never wait long.
func (m *Memory) sweep() {
	const batch = 64
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n := 0
		for k, b := range sh.m {
			if now := m.nowUs(); b.tat.u < now || (b.tat.u == now && b.tat.f == 0) {
				delete(sh.m, k)
			}
			if n++; n%batch == 0 {
				// Go allows a map to change between steps of a range loop;
				// the lock orders those changes with ours.
				sh.mu.Unlock()
				sh.mu.Lock()
			}
		}
		sh.mu.Unlock()
	}
}

func (m *Memory) nowUs() int64 {
	if m.clock != nil {
		return m.clock().UnixMicro()
	}
	return m.startUs + (nanotime()-m.startNs)/1000
}

// nanotime is the runtime's monotonic clock, which time.Since reads,
// without its wrappers: the clock read is the slowest step of a decision.
// The runtime keeps this name for packages that link to it.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// shardOf is FNV-1a over the key, inlined so that it does not allocate.
func shardOf(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}

func costError(key string, limit Limit, cost int) error {
	return fmt.Errorf("store: take %q: %w: cost %d is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, cost, limit.Burst, limit)
}

// TakeAll implements [MultiStore]: the shards of all the keys are locked
// together (in shard order, so that concurrent calls cannot deadlock) for
// one instant of the clock.
func (m *Memory) TakeAll(_ context.Context, reqs []Request) ([]Result, error) {
	ps, err := checkRequests(reqs)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(reqs))
	idx := make([]uint32, 0, len(reqs))
	for i, q := range reqs {
		keys[i] = q.Key
		if len(keys[i]) > maxKeyLen {
			keys[i] = hashKey(keys[i])
		}
		s := shardOf(keys[i]) & m.mask
		if !slices.Contains(idx, s) {
			idx = append(idx, s)
		}
	}
	slices.Sort(idx)
	now := m.nowUs()
	for _, s := range idx {
		m.shards[s].mu.Lock()
	}
	defer func() {
		for _, s := range idx {
			m.shards[s].mu.Unlock()
		}
	}()

	out := make([]Result, len(reqs))
	next := make([]bucket, len(reqs))
	writes := make([]bool, len(reqs))
	all := true
	for i, q := range reqs {
		b, ok := m.shards[shardOf(keys[i])&m.mask].m[keys[i]]
		var cur bucket
		if ok {
			cur = *b
		}
		out[i].Limit = q.Limit
		next[i], writes[i] = ps[i].decide(&out[i], cur, ok, now, int64(q.Cost))
		all = all && out[i].Allowed
	}
	if !all {
		// Nothing is taken: describe every bucket as it stands.
		for i, q := range reqs {
			sh := &m.shards[shardOf(keys[i])&m.mask]
			b, ok := sh.m[keys[i]]
			var cur bucket
			if ok {
				cur = *b
			}
			retry := out[i].RetryAfter
			out[i] = Result{Limit: q.Limit}
			ps[i].decide(&out[i], cur, ok, now, 0)
			out[i].Allowed, out[i].RetryAfter = false, retry
		}
		return out, nil
	}
	for i := range reqs {
		sh := &m.shards[shardOf(keys[i])&m.mask]
		b, ok := sh.m[keys[i]]
		switch {
		case writes[i] && ok:
			*b = next[i]
		case writes[i]:
			if len(sh.m) >= m.shardCap {
				m.evict(sh, now)
			}
			fresh := new(bucket)
			*fresh = next[i]
			sh.m[strings.Clone(keys[i])] = fresh
		case ok && out[i].ResetAfter == 0:
			delete(sh.m, keys[i])
		}
	}
	return out, nil
}
