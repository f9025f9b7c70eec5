package store

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxKeys caps the live buckets of a [Memory] store without [WithMaxKeys].
const DefaultMaxKeys = 1_000_000

// DefaultSweepInterval is how often a [Memory] store drops full buckets by default.
const DefaultSweepInterval = 10 * time.Second

const shards = 64

// Memory is a [Store] in this process, on its monotonic clock, with the
// semantics of [Redis]: for one server, tests, and degraded mode. Buckets
// live while not full in 64 maps behind read-write locks, each with its own
// mutex. Past MaxKeys a new key drops a full bucket, or forgets the nearest
// to full ([Memory.Evicted]), which can only loosen that key's limit. It is
// safe for concurrent use; call [NewMemory], and [Memory.Close] to stop its
// sweeper.
type Memory struct {
	shards        [shards]shard
	seeds         [2]maphash.Seed // of a key's id
	limits        limitCache
	maxKeys       int64
	live, evicted atomic.Int64
	clock         func() time.Time // nil: the monotonic clock
	start         time.Time
	sweep         time.Duration
	err           error // the first unusable option, for Validate
	stop, done    chan struct{}
	closeOnce     sync.Once
}

// A shard is one map of buckets, which come and go under its write lock; a
// new one starts at dropped or later, so a stale clock refills none. last and
// lastID (half its id) hint at the bucket found last, so that a hot key is
// found without the read lock, whose counter cores would bounce; the
// bucket's lock confirms it. 1.6x the decisions on one hot key at 16 and 64
// goroutines (go test -bench 'Decide/memory/tollgate' in bench/).
type shard struct {
	mu      sync.RWMutex
	buckets map[id]*bucket
	dropped int64 // the last instant a bucket was dropped
	last    atomic.Pointer[bucket]
	lastID  atomic.Uint64
	_       [8]byte // keep shards on separate cache lines
}

// An id names a key's bucket: two seeded 64-bit hashes of the key (a collision
// is one in 2^128, and no caller can aim at one). No key bytes saves a cache
// miss: 1.2-1.3x the decisions over 100,000 keys; two fields, not an array,
// go in registers: 10 % faster on one hot key (Decide/memory/tollgate in bench/).
type id struct{ a, b uint64 }

func (m *Memory) id(key string) id {
	return id{maphash.String(m.seeds[0], key), maphash.String(m.seeds[1], key)}
}

// A bucket is one key's state, dead once dropped. A window quota's has w, and
// s only says when it expires.
type bucket struct {
	mu   sync.Mutex
	s    tat
	dead bool
	id   id // read under mu: a hint may point to another bucket
	w    *win
}

// MemoryOption configures a [Memory] store.
type MemoryOption func(*Memory)

// WithMaxKeys caps live buckets at n (default [DefaultMaxKeys]); below 1 is an
// error for [Memory.Validate].
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
// (default [DefaultSweepInterval]); at 0 or below none starts.
func WithSweepInterval(d time.Duration) MemoryOption { return func(m *Memory) { m.sweep = d } }

// WithClock makes the store read the time from now, for tests; a clock going
// back can make decisions stricter (more debt), never looser. A nil now is an
// error for [Memory.Validate].
func WithClock(now func() time.Time) MemoryOption {
	return func(m *Memory) {
		if now != nil {
			m.clock = now
		} else if m.err == nil {
			m.err = fmt.Errorf("store: WithClock(nil)")
		}
	}
}

// NewMemory returns a Memory store and starts its sweeper (see [WithSweepInterval]).
func NewMemory(opts ...MemoryOption) *Memory {
	m := &Memory{
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, maxKeys: DefaultMaxKeys,
		start: time.Now(), sweep: DefaultSweepInterval,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	for _, o := range opts {
		if o != nil {
			o(m)
		}
	}
	for i := range m.shards {
		m.shards[i].buckets = make(map[id]*bucket)
		m.shards[i].dropped = math.MinInt64 // none yet, whatever the clock says
	}
	if m.sweep > 0 {
		go m.sweepLoop(m.sweep)
	} else {
		close(m.done)
	}
	return m
}

// Take implements [Store]. It ignores ctx (degraded mode decides past a
// deadline) and keeps no reference to key. Each entry point calls decide
// itself: through a helper of all their arguments one hot key took 10 %
// longer (go test -bench 'MemoryTake/hot/serial' ./store).
func (m *Memory) Take(_ context.Context, key string, limit Limit, cost int) (res Result, err error) {
	p, u, err := m.limits.units(key, limit, cost, false)
	if err == nil {
		m.decide(&res, m.id(key), p, u)
	}
	return res, err
}

// TakeBytes is Take for a key in bytes, which it neither keeps nor changes:
// the same bucket as the key as a string, decided without allocating.
func (m *Memory) TakeBytes(ctx context.Context, key []byte, limit Limit, cost int) (res Result, err error) {
	p, u, err := m.limits.units("", limit, cost, false)
	if err != nil {
		return m.Take(ctx, string(key), limit, cost) // the error, naming the key
	}
	m.decide(&res, id{maphash.Bytes(m.seeds[0], key), maphash.Bytes(m.seeds[1], key)}, p, u)
	return res, nil
}

// TakeDelayed implements [Delayer].
func (m *Memory) TakeDelayed(_ context.Context, key string, limit Limit, cost int, maxDelay time.Duration) (res Result, err error) {
	p, u, err := m.limits.units(key, limit, cost, false)
	var d params
	if err == nil {
		d, err = p.extend(maxDelay, false)
	}
	if err == nil {
		m.decide(&res, m.id(key), &d, u)
	}
	return res, err
}

// Refund implements [Refunder].
func (m *Memory) Refund(_ context.Context, key string, limit Limit, tokens int) (res Result, err error) {
	p, u, err := m.limits.units(key, limit, tokens, true)
	if err == nil {
		m.decide(&res, m.id(key), p, u)
	}
	return res, err
}

// Reset implements [Admin].
func (m *Memory) Reset(_ context.Context, key string, quotas ...Limit) error {
	ids := []id{m.id(key)}
	for _, l := range quotas {
		p, err := m.limits.get(l)
		if err != nil {
			return err
		}
		if p.spec != "" {
			ids = append(ids, m.windowID(ids[0], p))
		}
	}
	for _, k := range ids {
		sh := &m.shards[k.a%shards]
		sh.mu.Lock()
		if bk := sh.buckets[k]; bk != nil {
			bk.mu.Lock()
			m.drop(sh, bk, m.now())
			bk.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return nil
}

// windowID is the id of window quota p's state on the key of id k.
func (m *Memory) windowID(k id, p *params) id {
	return id{k.a ^ maphash.String(m.seeds[1], p.spec), k.b ^ maphash.String(m.seeds[0], p.spec)}
}

// Block implements [Admin].
func (m *Memory) Block(_ context.Context, key string, limit Limit, d time.Duration) error {
	p, err := m.limits.get(limit)
	var b params
	if err == nil {
		b, err = p.extend(d, true)
	}
	if err != nil {
		return err
	}
	var res Result
	if m.decide(&res, m.id(key), &b, b.block); !res.Allowed {
		return errBlockFull(key)
	}
	return nil
}

// decide adds k units (< 0: given back) to key's bucket or window quota: on
// an existing bucket under its lock alone, else as TakeAll.
func (m *Memory) decide(res *Result, key id, p *params, k int64) {
	if p.spec == "" && m.hinted(res, key, p, k) {
		return
	}
	ops := [1]op{{p: p, id: key, k: k}}
	if p.spec != "" {
		ops[0].id = m.windowID(key, p)
	}
	var out [1]Result
	m.decideAll(out[:], ops[:])
	*res = out[0]
}

// hinted decides on key's bucket if it has one, and reports whether it did;
// a bucket it leaves full is dropped.
func (m *Memory) hinted(res *Result, key id, p *params, k int64) bool {
	sh := &m.shards[key.a%shards]
	bk := sh.last.Load()
	if bk == nil || sh.lastID.Load() != key.a {
		sh.mu.RLock()
		bk = sh.buckets[key]
		sh.mu.RUnlock()
		if bk == nil {
			return false
		}
		sh.last.Store(bk)
		sh.lastID.Store(key.a)
	}
	now := m.now() // outside the locks: the clock is the slowest step
	bk.mu.Lock()
	if bk.dead || bk.id != key { // a stale hint, or a dropped bucket
		bk.mu.Unlock()
		return false
	}
	du, df := p.debt(bk.s, now)
	allowed := p.fits(du, df, k)
	if allowed && k != 0 {
		du, df = p.after(du, df, k)
		bk.s = tat{now + du, df, p.q}
	}
	bk.mu.Unlock()
	p.fill(res, du, df, k, allowed)
	if du == 0 && df == 0 { // full: a read or a refund drops it
		sh.mu.Lock()
		if bk.mu.Lock(); !bk.dead && bk.s.fullAt(now) {
			m.drop(sh, bk, now)
		}
		bk.mu.Unlock()
		sh.mu.Unlock()
	}
	return true
}

// An op is one bucket's or window quota's part in decideAll.
type op struct {
	p      *params
	id     id
	k      int64
	bk     *bucket
	du, df int64
	v      winView
	w      win
}

// decideAll decides ops (of distinct ids) at one instant, all or nothing,
// into out. It write-locks their shards in order, then their buckets: the
// other holders of a bucket's lock hold no other, so it cannot deadlock.
func (m *Memory) decideAll(out []Result, ops []op) {
	var held [shards]bool
	for _, o := range ops {
		held[o.id.a%shards] = true
	}
	now := m.now()
	clock := now // a window quota's instant: windows are not dropped early
	for i := range held {
		if held[i] {
			m.shards[i].mu.Lock()
			now = max(now, m.shards[i].dropped)
		}
	}
	all := true
	for i := range ops {
		o := &ops[i]
		if o.bk = m.shards[o.id.a%shards].buckets[o.id]; o.bk != nil {
			o.bk.mu.Lock()
			o.du, o.df = o.p.debt(o.bk.s, now)
			if o.bk.w != nil {
				o.w = *o.bk.w
			}
		}
		if o.p.spec != "" {
			wall := clock
			if m.clock == nil {
				wall += m.start.UnixMicro() // the wall clock, run by the monotonic one
			}
			o.v = o.p.view(o.w, o.p.bounds(wall), wall)
			all = all && o.p.fitsWindow(o.v, o.k)
		} else {
			all = all && o.p.fits(o.du, o.df, o.k)
		}
	}
	for i := range ops {
		o := &ops[i]
		sh := &m.shards[o.id.a%shards]
		switch {
		case o.p.spec != "" && all:
			var changed bool
			if o.v, o.w, changed = o.p.applyWindow(o.w, o.v, o.k); changed && o.bk != nil {
				m.writeWindow(sh, o, clock, &held)
			}
		case all && o.k != 0:
			o.du, o.df = o.p.after(o.du, o.df, o.k)
			if o.bk != nil {
				o.bk.s = tat{now + o.du, o.df, o.p.q}
			}
		}
		if o.bk != nil {
			o.bk.mu.Unlock()
		}
		if o.p.spec != "" {
			o.p.fillWindow(&out[i], o.v, o.k, all)
		} else {
			o.p.fill(&out[i], o.du, o.df, o.k, all)
		}
	}
	for i := range ops { // new buckets last, no bucket locked: making room locks some
		o := &ops[i]
		sh := &m.shards[o.id.a%shards]
		switch {
		case !all || o.k <= 0 || o.bk != nil:
		case o.p.spec != "":
			m.writeWindow(sh, o, clock, &held)
		default:
			m.insert(sh, &bucket{s: tat{now + o.du, o.df, o.p.q}, id: o.id}, now, &held)
		}
	}
	for i := range held {
		if held[i] {
			m.shards[i].mu.Unlock()
		}
	}
}

// insert adds bk to sh, making room first at MaxKeys (the cap holds at every
// instant). The caller write-locks the held shards, sh among them.
func (m *Memory) insert(sh *shard, bk *bucket, now int64, held *[shards]bool) {
	for n := m.live.Load(); n >= m.maxKeys || !m.live.CompareAndSwap(n, n+1); n = m.live.Load() {
		if n >= m.maxKeys {
			m.evict(held, now)
		}
	}
	sh.buckets[bk.id] = bk
	sh.last.Store(bk) // the next Take of this key takes the hinted path
	sh.lastID.Store(bk.id.a)
}

// writeWindow makes o.w the state of o's window quota (o.bk nil: new). The
// caller write-locks the held shards, sh among them, and holds o.bk.mu.
func (m *Memory) writeWindow(sh *shard, o *op, now int64, held *[shards]bool) {
	s := tat{u: now + o.p.ttl(o.v), q: 1}
	switch w := o.w; {
	case w.cur == 0 && w.prev == 0 && o.bk != nil: // nothing counted: no state, as in the script
		m.drop(sh, o.bk, now)
	case w.cur == 0 && w.prev == 0:
	case o.bk == nil:
		m.insert(sh, &bucket{s: s, id: o.id, w: &w}, now, held)
	default:
		o.bk.s, *o.bk.w = s, w
	}
}

// drop removes bk from sh. The caller holds sh's write lock and bk.mu.
func (m *Memory) drop(sh *shard, bk *bucket, now int64) {
	bk.dead = true
	delete(sh.buckets, bk.id)
	sh.dropped = max(sh.dropped, now)
	m.live.Add(-1)
}

// evict drops a bucket from a shard held or one it can lock without waiting
// (waiting could deadlock); if every other is busy, it yields.
func (m *Memory) evict(held *[shards]bool, now int64) {
	for i := range m.shards {
		if held[i] && m.evictFrom(&m.shards[i], now) {
			return
		}
	}
	for i := range m.shards {
		if sh := &m.shards[i]; !held[i] && sh.mu.TryLock() {
			ok := m.evictFrom(sh, now)
			sh.mu.Unlock()
			if ok {
				return
			}
		}
	}
	runtime.Gosched()
}

// evictFrom drops, of up to 8 buckets of sh (random map order), the first
// full, else the nearest to full, and reports if it did; sh.mu is held.
func (m *Memory) evictFrom(sh *shard, now int64) bool {
	vb, vt, n := (*bucket)(nil), tat{}, 0
	for _, bk := range sh.buckets {
		bk.mu.Lock()
		s := bk.s
		bk.mu.Unlock()
		if n == 0 || s.u < vt.u {
			vb, vt = bk, s
		}
		if n++; n == 8 || s.fullAt(now) {
			break
		}
	}
	if n == 0 {
		return false
	}
	vb.mu.Lock()
	if !vb.s.fullAt(now) {
		m.evicted.Add(1)
	}
	m.drop(sh, vb, now)
	vb.mu.Unlock()
	return true
}

func (s *tat) fullAt(now int64) bool { return s.u < now || (s.u == now && s.f == 0) }

// TakeAll implements [MultiStore], at one instant.
func (m *Memory) TakeAll(_ context.Context, reqs []Request) ([]Result, error) {
	ps, err := checkRequests(reqs, &m.limits)
	if err != nil {
		return nil, err
	}
	ops := make([]op, len(reqs))
	for i, q := range reqs {
		ops[i] = op{p: &ps[i], id: m.id(q.Key), k: int64(q.Cost) * ps[i].t}
		if ps[i].spec != "" {
			ops[i].id = m.windowID(ops[i].id, &ps[i])
		}
		for _, o := range ops[:i] {
			if o.id == ops[i].id { // keys differ (checkRequests): a 2^-128 chance
				return nil, fmt.Errorf("store: take all: %w %q (the same id)", ErrDuplicateKey, q.Key)
			}
		}
	}
	out := make([]Result, len(reqs))
	m.decideAll(out, ops)
	return out, nil
}

// Validate returns the first unusable option's error (the store ignores
// that option), or nil; for a nil *Memory, an error.
func (m *Memory) Validate() error {
	if m == nil {
		return errors.New("store: a nil *Memory: make one with NewMemory")
	}
	return m.err
}

// Len returns the number of live buckets.
func (m *Memory) Len() int { return int(m.live.Load()) }

// Evicted returns how many buckets not yet full were forgotten to respect
// MaxKeys: a growing count means the cap is too low.
func (m *Memory) Evicted() int64 { return m.evicted.Load() }

// Close stops the sweeper and waits for it; it is safe to call more than once
// and returns nil. The store still decides after it.
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
			m.Sweep()
		}
	}
}

// Sweep drops every full bucket now, a shard at a time, as the sweeper does.
func (m *Memory) Sweep() {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		now := m.now()
		for _, bk := range sh.buckets {
			if bk.mu.Lock(); bk.s.fullAt(now) {
				m.drop(sh, bk, now)
			}
			bk.mu.Unlock()
		}
		sh.mu.Unlock()
	}
}

func (m *Memory) now() int64 {
	if m.clock != nil {
		return m.clock().UnixMicro()
	}
	return time.Since(m.start).Microseconds() // the monotonic clock
}
