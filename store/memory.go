package store

import (
	"context"
	"fmt"
	"hash/maphash"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxKeys caps the live buckets of a [Memory] store without [WithMaxKeys].
const DefaultMaxKeys = 1_000_000

// DefaultSweepInterval is how often a [Memory] store drops full buckets by default.
const DefaultSweepInterval = 10 * time.Second

// shards is how many maps, each behind its own lock, hold a Memory's buckets.
const shards = 64

// Memory is a [Store] that keeps buckets in this process, on its monotonic
// clock, with the same semantics as [Redis]: for single servers, tests, and
// degraded mode when Redis is unreachable. Buckets live in 64 maps, each
// behind a mutex held for a map lookup and a few integer operations per
// decision. A bucket exists only while it is not full: a background sweeper,
// a read or a refund drops it once full again. At most MaxKeys buckets live
// at once: a new key beyond that samples a few buckets and drops the full
// ones, or else forgets the one nearest to full ([Memory.Evicted]), which can
// only loosen that key's limit. Memory is safe for concurrent use. Its zero
// value is not usable; call [NewMemory], and [Memory.Close] to stop the sweeper.
type Memory struct {
	shards    [shards]shard
	seeds     [2]maphash.Seed
	limits    limitCache
	maxKeys   int64
	live      atomic.Int64 // buckets in all shards
	evicted   atomic.Int64
	clock     func() time.Time // nil: the monotonic clock
	start     time.Time
	sweep     time.Duration
	err       error // the first unusable option, for Validate
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// A shard is one map of buckets. Every decision on it uses at least last, the
// latest instant one used, so its clock never goes back, even for a goroutine
// preempted after reading the clock while a bucket was dropped later.
type shard struct {
	mu      sync.Mutex
	buckets map[id]*tat // pointers: a decision updates its bucket with one map lookup
	last    int64
	_       [32]byte // keep shards on separate cache lines
}

// An id names a bucket: a 128-bit hash of its key under two random seeds, so
// a bucket costs a map slot and its state (48 bytes) whatever its key's length
// and a decision reads two places in memory, not three (slot, key, state).
// Two keys collide with a chance of 2^-128 per pair, unfindable from outside.
type id [2]uint64

func (m *Memory) id(key string) id {
	return id{maphash.String(m.seeds[0], key), maphash.String(m.seeds[1], key)}
}

// MemoryOption configures a [Memory] store.
type MemoryOption func(*Memory)

// WithMaxKeys caps live buckets at n (default [DefaultMaxKeys]). Below 1, it is
// an error for [Memory.Validate] (middleware.New refuses it); the default stays.
func WithMaxKeys(n int) MemoryOption {
	return func(m *Memory) {
		if n >= 1 {
			m.maxKeys = int64(n)
		} else if m.err == nil {
			m.err = fmt.Errorf("store: WithMaxKeys(%d): the cap must be at least 1", n)
		}
	}
}

// WithSweepInterval sets how often a background sweeper drops full buckets
// (default [DefaultSweepInterval]). At 0 or below none starts: full buckets
// are dropped only to make room for new keys, or when a refund fills them.
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(m *Memory) { m.sweep = d }
}

// WithClock makes the store read the time from now instead of its monotonic
// clock, for tests; a clock going back counts as standing still. A nil now is
// an error that [Memory.Validate] reports, and the monotonic clock stays.
func WithClock(now func() time.Time) MemoryOption {
	return func(m *Memory) {
		if now != nil {
			m.clock = now
		} else if m.err == nil {
			m.err = fmt.Errorf("store: WithClock(nil)")
		}
	}
}

// NewMemory returns a Memory store. Unless [WithSweepInterval] disables it,
// it starts one goroutine, which [Memory.Close] stops.
func NewMemory(opts ...MemoryOption) *Memory {
	m := &Memory{
		seeds:   [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		maxKeys: DefaultMaxKeys,
		start:   time.Now(),
		sweep:   DefaultSweepInterval,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for _, o := range opts {
		if o != nil {
			o(m)
		}
	}
	for i := range m.shards {
		m.shards[i].buckets = make(map[id]*tat)
	}
	if m.sweep > 0 {
		go m.sweepLoop(m.sweep)
	} else {
		close(m.done)
	}
	return m
}

// Take implements [Store]. It never blocks on I/O and ignores ctx, so it still
// decides past a deadline (degraded mode); it keeps no reference to key.
func (m *Memory) Take(_ context.Context, key string, limit Limit, cost int) (res Result, err error) {
	p, k, err := m.limits.units(key, limit, cost, false)
	if err == nil {
		m.decide(&res, key, p, k)
	}
	return res, err
}

// Refund implements [Refunder].
func (m *Memory) Refund(_ context.Context, key string, limit Limit, tokens int) (res Result, err error) {
	p, k, err := m.limits.units(key, limit, tokens, true)
	if err == nil {
		m.decide(&res, key, p, k)
	}
	return res, err
}

// decide adds k units to key's bucket (k < 0 gives back) and fills res.
func (m *Memory) decide(res *Result, key string, p *params, k int64) {
	b := m.id(key)
	now := m.now() // outside the lock: the clock is the slowest step
	sh := &m.shards[b[0]%shards]
	sh.mu.Lock()
	now = sh.advance(now)
	s := sh.buckets[b]
	var du, df int64
	if s != nil {
		du, df = p.debt(*s, now)
	}
	allowed := p.fits(du, df, k)
	if allowed && k != 0 {
		du, df = p.after(du, df, k)
	}
	if allowed && (k != 0 || (s != nil && du == 0 && df == 0)) { // a read drops a full bucket
		m.write(sh, b, s, p, du, df, now, []*shard{sh})
	}
	sh.mu.Unlock()
	p.fill(res, du, df, k, allowed)
}

// advance returns and records max(now, sh.last). The caller holds sh.mu.
func (sh *shard) advance(now int64) int64 {
	now = max(now, sh.last)
	sh.last = now
	return now
}

// write stores the debt (du, df) at now as bucket b of sh (state cur, or nil);
// no debt is no state. The caller holds the locks of held, sh's among them.
func (m *Memory) write(sh *shard, b id, cur *tat, p *params, du, df, now int64, held []*shard) {
	s, ok := tat{now + du, df, p.q}, du > 0 || df > 0
	switch {
	case ok && cur != nil:
		*cur = s
	case ok:
		for n := m.live.Load(); n >= m.maxKeys || !m.live.CompareAndSwap(n, n+1); n = m.live.Load() {
			if n >= m.maxKeys {
				m.evict(held, now) // make room first: the cap holds at every instant
			}
		}
		nb := s // on the heap: declared here, it costs a new bucket only
		sh.buckets[b] = &nb
	case cur != nil: // full again: a missing key is a full bucket
		delete(sh.buckets, b)
		m.live.Add(-1)
	}
}

// evict drops a bucket to make room, from a shard held or one it can lock
// without waiting (waiting could deadlock); if every other is busy, it yields.
func (m *Memory) evict(held []*shard, now int64) {
	for _, sh := range held {
		if m.evictFrom(sh, now) {
			return
		}
	}
	for i := range m.shards {
		if sh := &m.shards[i]; !slices.Contains(held, sh) && sh.mu.TryLock() {
			ok := m.evictFrom(sh, sh.advance(now))
			sh.mu.Unlock()
			if ok {
				return
			}
		}
	}
	runtime.Gosched()
}

// evictFrom samples up to 8 buckets of sh (map iteration starts at a random
// place) and drops the first that is full at now, or else the one nearest to
// full. It reports whether it dropped one. The caller holds sh.mu.
func (m *Memory) evictFrom(sh *shard, now int64) bool {
	victim, vt, n := id{}, tat{}, 0
	for b, s := range sh.buckets {
		if n == 0 || s.u < vt.u {
			victim, vt = b, *s
		}
		if n++; n == 8 || s.fullAt(now) {
			break
		}
	}
	if n == 0 {
		return false
	}
	if !vt.fullAt(now) {
		m.evicted.Add(1)
	}
	delete(sh.buckets, victim)
	m.live.Add(-1)
	return true
}

// fullAt reports whether a bucket in state s is full at now.
func (s *tat) fullAt(now int64) bool { return s.u < now || (s.u == now && s.f == 0) }

// TakeAll implements [MultiStore], deciding every bucket at one instant with
// the keys' shards locked in order (so that concurrent calls cannot deadlock).
func (m *Memory) TakeAll(_ context.Context, reqs []Request) ([]Result, error) {
	ps, err := checkRequests(reqs, &m.limits)
	if err != nil {
		return nil, err
	}
	ids, in := make([]id, len(reqs)), make([]*shard, len(reqs))
	var order []uint64
	for i, q := range reqs {
		ids[i] = m.id(q.Key)
		n := ids[i][0] % shards
		in[i] = &m.shards[n]
		if !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	slices.Sort(order) // the order of locking
	held := make([]*shard, len(order))
	now := m.now()
	for i, n := range order {
		held[i] = &m.shards[n]
		held[i].mu.Lock()
		now = max(now, held[i].last)
	}
	type debt struct {
		du, df, k int64
		cur       *tat
	}
	ds := make([]debt, len(reqs))
	all := true
	for i, q := range reqs {
		in[i].last = now
		d := &ds[i]
		d.k = int64(q.Cost) * ps[i].t
		if d.cur = in[i].buckets[ids[i]]; d.cur != nil {
			d.du, d.df = ps[i].debt(*d.cur, now)
		}
		all = all && ps[i].fits(d.du, d.df, d.k)
	}
	out := make([]Result, len(reqs))
	for i, d := range ds {
		if all && d.k != 0 {
			d.du, d.df = ps[i].after(d.du, d.df, d.k)
			m.write(in[i], ids[i], d.cur, ps[i], d.du, d.df, now, held)
		}
		out[i] = ps[i].result(d.du, d.df, d.k, all)
	}
	for _, sh := range held {
		sh.mu.Unlock()
	}
	return out, nil
}

// Validate returns the first unusable option's error (such as WithMaxKeys(0)),
// or nil. The store ignores that option; middleware.New refuses the store.
func (m *Memory) Validate() error { return m.err }

// Len returns the number of live buckets.
func (m *Memory) Len() int { return int(m.live.Load()) }

// Evicted returns how many buckets not yet full were forgotten to respect
// MaxKeys; a growing count means the cap is too low (or a flood of new keys).
func (m *Memory) Evicted() int64 { return m.evicted.Load() }

// Close stops the background sweeper and waits for it to return. It is safe
// to call more than once and returns nil; the store still decides after it.
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
		}
		for i := range m.shards { // drop every full bucket, a shard at a time
			sh := &m.shards[i]
			sh.mu.Lock()
			now := sh.advance(m.now())
			for b, s := range sh.buckets {
				if s.fullAt(now) {
					delete(sh.buckets, b)
					m.live.Add(-1)
				}
			}
			sh.mu.Unlock()
		}
	}
}

// now returns the current instant in microseconds.
func (m *Memory) now() int64 {
	if m.clock != nil {
		return m.clock().UnixMicro()
	}
	return time.Since(m.start).Microseconds() // the monotonic clock
}
