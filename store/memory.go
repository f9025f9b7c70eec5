package store

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// DefaultMaxKeys is the number of live buckets a [Memory] store holds at
// most unless [WithMaxKeys] says otherwise. A bucket costs about 120 bytes
// with a key of up to 16 bytes, and about 170 with one of 64.
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
// Buckets live in shards. A decision on a known key finds its bucket
// without a lock and, in the common case, updates it without one too (a
// compare-and-swap of its state), so decisions on different keys never
// contend, and goroutines deciding on one hot key do not wait on a mutex.
// The exceptions take the bucket's lock: limits whose capacity is above
// 2^50 units of the script's one-key form, TakeAll, and a bucket being
// dropped. A bucket is made for one Limit: a decision on its key under
// another Limit replaces it (in the same state), under the shard's lock.
// The store is bounded: buckets that are full again are dropped
// (incrementally, by a background sweeper, when read full, and whenever a
// shard is at capacity), and no more than MaxKeys buckets live at once. When a flood of
// distinct keys fills a shard, the sampled bucket nearest to full is
// forgotten to make room, which can only loosen a limit, never tighten it.
//
// Memory is safe for concurrent use. Its zero value is not usable; call
// [NewMemory], and [Memory.Close] when done to stop the sweeper.
type Memory struct {
	shards   []memShard
	mask     uint32
	seed     maphash.Seed
	seed64   uintptr // the seed of keyHash on 64-bit platforms
	shardCap int
	clock    func() time.Time // nil: the monotonic clock below
	start    time.Time
	startUs  int64
	startNs  int64 // nanotime() at start
	evicted  atomic.Int64
	cfgErr   error                           // the first unusable option, for Validate
	lims     [16]atomic.Pointer[limitParams] // Limits buckets were recently made for
	nextLim  atomic.Uint32                   // the slot of lims to fill next

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// A shard keeps its buckets in an open-addressing table (see cellTable),
// indexed by the key's 64-bit hash (seeded per store): a lookup reads it
// without a lock, while inserts, removals and resizes take mu. A resize
// publishes a new table, and a lookup on the old one can only miss a
// bucket (then it asks under mu) or find one that is dropped (its rate is
// 0), never a wrong one.
//
// Lock order: a shard's mu before a cell's mu. Only TakeAll holds several
// cells, and it holds the mu of every shard involved first.
type memShard struct {
	table atomic.Pointer[cellTable]
	mu    sync.Mutex
	live  int      // buckets in the table
	used  int      // slots that are not empty: live buckets and tombstones
	_     [64]byte // keep shards on separate cache lines
}

// lookup returns the bucket of key in shard sh, or nil. The caller holds
// sh.mu.
func (sh *memShard) lookup(h uint64, key string) *cell {
	return sh.table.Load().find(h, key)
}

// add puts c, a bucket whose key the shard does not hold, in the shard,
// first rebuilding its table when seven eighths of its slots are used
// (buckets and tombstones): to the size that leaves it at most 7/16 full,
// which grows it, clears it of tombstones, or shrinks it. The caller holds
// sh.mu.
func (sh *memShard) add(c *cell) {
	t := sh.table.Load()
	if 8*(sh.used+1) > 7*t.slots() {
		groups := minTable
		for 16*(sh.live+1) > 7*groups*groupSlots {
			groups *= 2
		}
		nt := newTable(groups)
		for i := range t.slots() {
			if old := t.at(i); old != nil {
				nt.add(old)
			}
		}
		sh.table.Store(nt)
		t, sh.used = nt, sh.live
	}
	if t.add(c) {
		sh.used++
	}
	sh.live++
}

// remove takes c, a bucket of the shard, out of it and marks it dropped.
// The caller holds sh.mu and c.mu, and claimed c, which stays locked.
func (sh *memShard) remove(c *cell) {
	c.b.rate = 0
	if sh.table.Load().remove(c) {
		sh.live--
	}
}

// A cell is one live bucket, made for one Limit, whose parameters it keeps
// (a decision under another Limit replaces the cell).
//
// Its state lives in one of two places. Usually it is st, one word that a
// decision under the cell's Limit reads and swaps without a lock (see
// decideFast), so that goroutines deciding on one hot key do not park on a
// mutex. While st is locked, the state is b, under mu: for a moment, while
// a caller holding mu reads or writes it (see claim and release), or for as
// long as it does not fit in a word: a limit whose capacity is above 2^50
// units, an instant before the cell's epoch or more than 2^61 units after
// it, or a fraction counted in another rate (written by TakeAll under
// another Limit).
//
// The fields a decision without a lock reads come first, after the key's
// bytes when they are in the same allocation (see newCell).
type cell struct {
	h     uint64        // the key's hash
	key   string        // a copy of the caller's
	st    atomic.Uint64 // locked, 0 for a full bucket, or 1 + the TAT in units of 1/lp.u.q µs after epoch
	epoch int64         // µs: the instant the cell was made at
	lp    *limitParams  // the Limit the cell is made for, shared by its other cells; never changes
	mu    sync.Mutex
	b     bucket // the state while st is locked; b.rate == 0: dropped from the store
}

// A cell and its key's bytes, in one allocation: a lookup that reaches the
// cell finds the key to compare next to it.
type (
	cell16 struct {
		k [16]byte
		c cell
	}
	cell32 struct {
		k [32]byte
		c cell
	}
	cell64 struct {
		k [64]byte
		c cell
	}
)

// locked is the st of a cell whose state is in b. Every other st is below
// 2^62.
const locked = 1 << 63

// maxUnits bounds the instants, in units after the epoch, that st holds:
// an instant plus a bucket's capacity (at most 2^50) stays below 2^62.
const maxUnits = 1 << 61

// newCell returns a cell for key, whose hash is h, made at instant now for
// the Limit of lp, in state b. It holds a copy of key: the caller's may be
// reused.
func (m *Memory) newCell(key string, h uint64, lp *limitParams, b bucket, now int64) *cell {
	var c *cell
	var k []byte
	switch n := len(key); {
	case n <= 16:
		x := new(cell16)
		c, k = &x.c, x.k[:n]
	case n <= 32:
		x := new(cell32)
		c, k = &x.c, x.k[:n]
	case n <= 64:
		x := new(cell64)
		c, k = &x.c, x.k[:n]
	default:
		c, k = new(cell), make([]byte, n)
	}
	copy(k, key)
	*c = cell{h: h, key: unsafe.String(unsafe.SliceData(k), len(k)), b: b, lp: lp, epoch: now}
	c.st.Store(locked)
	m.release(c)
	return c
}

// claim moves c's state into c.b, where decisions without a lock cannot
// change it, until release. The caller holds c.mu.
func (m *Memory) claim(c *cell) {
	for {
		s := c.st.Load()
		if s == locked {
			return
		}
		if c.st.CompareAndSwap(s, locked) {
			c.b = m.unpack(c, s)
			return
		}
	}
}

// release hands c's state back to decisions without a lock, if it fits in
// st. The caller holds c.mu and claimed c. A dropped cell stays locked.
func (m *Memory) release(c *cell) {
	if s, ok := m.pack(c, c.b); ok {
		c.st.Store(s)
	}
}

// pack returns b as c's st; ok is false when it does not fit.
func (m *Memory) pack(c *cell, b bucket) (s uint64, ok bool) {
	switch {
	case c.lp.u.t == 0 || b.rate == 0:
		return 0, false
	case !b.has():
		return 0, true
	case b.tat.f != 0 && b.rate != c.lp.u.q:
		return 0, false // a fraction of another rate: wait for the next write
	case b.tat.u < c.epoch:
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(b.tat.u-c.epoch), uint64(c.lp.u.q))
	if hi != 0 || lo > maxUnits {
		return 0, false
	}
	return lo + uint64(b.tat.f) + 1, true
}

// unpack returns the state that st s of c holds.
func (m *Memory) unpack(c *cell, s uint64) bucket {
	if s == 0 {
		return bucket{rate: c.lp.u.q}
	}
	x, q := s-1, uint64(c.lp.u.q)
	return bucket{tat: span{c.epoch + int64(x/q), int64(x % q)}, rate: c.lp.u.q}
}

// limitParams is a valid Limit, its params, and the params in the units
// of the script's one-key form (u.t == 0 when the capacity is above 2^50
// of them).
type limitParams struct {
	l Limit
	p params
	u units
}

// limitParams returns limit's params, shared by the buckets made for it:
// a store filling with keys under up to 16 limits computes them (a gcd and
// divisions) and allocates them once per limit. Under more limits in turn,
// new buckets may get copies of their own.
func (m *Memory) limitParams(limit Limit) (*limitParams, error) {
	for i := range m.lims {
		if lp := m.lims[i].Load(); lp != nil && lp.l == limit {
			return lp, nil
		}
	}
	p, err := limit.params()
	if err != nil {
		return nil, err
	}
	lp := &limitParams{l: limit, p: p}
	if u, ok := p.units(); ok {
		lp.u = u
	}
	m.lims[m.nextLim.Add(1)%uint32(len(m.lims))].Store(lp)
	return lp, nil
}

// has reports whether b is a state: a zero TAT stands for a full bucket,
// which a missing key also is.
func (b *bucket) has() bool { return b.tat != span{} }

// full reports whether bucket b holds all its tokens at instant now.
func (b *bucket) full(now int64) bool {
	return !b.has() || b.tat.u < now || (b.tat.u == now && b.tat.f == 0)
}

// MemoryOption configures a [Memory] store.
type MemoryOption func(*memoryConfig)

type memoryConfig struct {
	maxKeys int
	sweep   time.Duration
	clock   func() time.Time
	err     error // the first unusable option
}

// fail records the first unusable option.
func (c *memoryConfig) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("store: "+format, args...)
	}
}

// WithMaxKeys caps the number of live buckets at n (default
// [DefaultMaxKeys]). A value below 1 is an error that [Memory.Validate]
// reports (and middleware.New refuses); the store keeps the default cap.
func WithMaxKeys(n int) MemoryOption {
	return func(c *memoryConfig) {
		if n < 1 {
			c.fail("WithMaxKeys(%d): the cap must be at least 1", n)
			return
		}
		c.maxKeys = n
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
// backwards; if it does, buckets simply refill later. A nil now is an error
// that [Memory.Validate] reports; the store keeps the monotonic clock.
func WithClock(now func() time.Time) MemoryOption {
	return func(c *memoryConfig) {
		if now == nil {
			c.fail("WithClock(nil)")
			return
		}
		c.clock = now
	}
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
		seed:     maphash.MakeSeed(),
		seed64:   uintptr(rand.Uint64()),
		shardCap: cfg.maxKeys / n,
		clock:    cfg.clock,
		cfgErr:   cfg.err,
		start:    time.Now(),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	m.startUs = m.start.UnixMicro()
	m.startNs = nanotime()
	for i := range m.shards {
		m.shards[i].table.Store(newTable(minTable))
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
func (m *Memory) Take(_ context.Context, key string, limit Limit, cost int) (res Result, err error) {
	if cost < 0 || cost > limit.Burst {
		if err := limit.Validate(); err != nil {
			return Result{}, err
		}
		return Result{}, costError(key, limit, cost)
	}
	err = m.decide(key, limit, cost, &res)
	return res, err
}

// Refund implements [Refunder].
func (m *Memory) Refund(_ context.Context, key string, limit Limit, tokens int) (res Result, err error) {
	if err := limit.Validate(); err != nil {
		return Result{}, err
	}
	if tokens < 0 || tokens > limit.Burst {
		return Result{}, refundError(key, limit, tokens)
	}
	err = m.decide(key, limit, -tokens, &res)
	return res, err
}

// decide takes cost tokens from key's bucket (gives -cost back when cost is
// negative) and fills in res. The common case, a known key decided with the
// Limit its bucket was made for, takes no lock at all (decideFast).
func (m *Memory) decide(key string, limit Limit, cost int, res *Result) error {
	if len(key) > maxKeyLen {
		// Hashed on the stack: a bucket that keeps the key copies it.
		var b [maxHashedKey]byte
		h := appendHashKey(b[:0], key)
		key = unsafe.String(unsafe.SliceData(h), len(h))
	}
	now := m.nowUs() // read outside any lock: the clock is the slowest step
	h := m.keyHash(key)
	sh := m.shardOf(h)
	res.Limit = limit
	if c := sh.table.Load().find(h, key); c != nil && c.lp.l == limit {
		done, full := m.decideFast(c, now, int64(cost), res)
		if !done {
			c.mu.Lock()
			m.claim(c)
			if c.b.rate == 0 {
				c.mu.Unlock() // dropped meanwhile: ask under the shard's lock
				return m.decideLocked(sh, key, h, limit, now, cost, res)
			}
			nb, write := c.lp.p.decide(res, c.b, c.b.has(), now, int64(cost))
			full = !write && res.ResetAfter == 0
			switch {
			case write:
				c.b = nb
			case full:
				c.b.tat = span{} // as a refund that fills the bucket leaves it
			}
			m.release(c)
			c.mu.Unlock()
		}
		if full {
			m.drop(sh, c, now) // full again: a missing key is a full bucket
		}
		return nil
	}
	return m.decideLocked(sh, key, h, limit, now, cost, res)
}

// decideFast is decide on c, a cell made for the caller's Limit, without a
// lock: it reads c's st, computes the decision in the units of the script's
// one-key form (the same figures as params.decide), and swaps the new state
// in, over again if another decision changed st meanwhile. done is false
// when the state is under c.mu or does not fit in st; full reports a bucket
// that is full at now.
func (m *Memory) decideFast(c *cell, now, cost int64, res *Result) (done, full bool) {
	u := &c.lp.u
	if u.t == 0 || now < c.epoch {
		return false, false
	}
	hi, at := bits.Mul64(uint64(now-c.epoch), uint64(u.q)) // now, in units after the epoch
	if hi != 0 || at > maxUnits {
		return false, false
	}
	k := cost * u.t
	for {
		s := c.st.Load()
		if s == locked {
			return false, false
		}
		var debt int64 // how far the bucket is from full
		clamped := false
		if s > at+1 {
			debt = int64(s - 1 - at)
			if debt > u.cap {
				// A larger limit's state: an empty bucket, which a
				// denial writes (see params.decide).
				debt, clamped = u.cap, true
			}
		}
		r := debt // the one-key form's reply
		switch {
		case k > 0 && debt+k <= u.cap:
			debt += k
			r = debt
		case k > 0:
			r = -1 - debt
		case k < 0:
			debt = max(debt+k, 0)
			r = debt
		}
		ns := s
		switch {
		case r < 0 && !clamped: // denied: nothing changes
		case debt == 0:
			ns = 0 // full, as a refund that fills the bucket leaves it
		case k != 0:
			ns = at + uint64(debt) + 1
		}
		if ns == s || c.st.CompareAndSwap(s, ns) {
			u.fill(res, r, k)
			return true, debt == 0
		}
	}
}

// decideLocked is decide under the shard's lock, for a key that the
// lock-free lookup did not find, or whose bucket was made for another Limit
// (the bucket is then replaced by one made for limit, in the same state).
func (m *Memory) decideLocked(sh *memShard, key string, h uint64, limit Limit, now int64, cost int, res *Result) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.lookup(h, key)
	if c != nil && c.lp.l == limit {
		c.mu.Lock()
		m.claim(c)
		nb, write := c.lp.p.decide(res, c.b, c.b.has(), now, int64(cost))
		switch {
		case write:
			c.b = nb
		case res.ResetAfter == 0:
			sh.remove(c)
		}
		m.release(c)
		c.mu.Unlock()
		return nil
	}
	lp, err := m.limitParams(limit)
	if err != nil {
		*res = Result{}
		return err
	}
	if c == nil {
		nb, write := lp.p.decide(res, bucket{}, false, now, int64(cost))
		if write {
			m.insert(sh, m.newCell(key, h, lp, nb, now), now)
		}
		return nil
	}
	// Made for another Limit: replace it.
	c.mu.Lock()
	m.claim(c)
	cur := c.b
	sh.remove(c)
	c.mu.Unlock()
	nb, write := lp.p.decide(res, cur, cur.has(), now, int64(cost))
	if !write && res.ResetAfter != 0 {
		nb, write = cur, true // not full: keep its state
	}
	if write {
		m.insert(sh, m.newCell(key, h, lp, nb, now), now)
	}
	return nil
}

// insert adds c, a new bucket, to shard sh, whose lock the caller
// holds, making room first if the shard is at capacity.
func (m *Memory) insert(sh *memShard, c *cell, now int64) {
	if sh.live >= m.shardCap {
		m.evict(sh, now)
	}
	sh.add(c)
}

// drop removes c, a bucket of sh, if it is still there and full at now.
func (m *Memory) drop(sh *memShard, c *cell, now int64) {
	sh.mu.Lock()
	c.mu.Lock()
	m.claim(c)
	if c.b.rate != 0 && c.b.full(now) {
		sh.remove(c)
	}
	m.release(c)
	c.mu.Unlock()
	sh.mu.Unlock()
}

// evict makes room in a full shard: it samples a few buckets from a random
// slot on, drops those that are full again, and if there were none, the one
// nearest to full. The caller holds sh.mu and no cell's lock.
func (m *Memory) evict(sh *memShard, now int64) {
	const samples = 16
	t := sh.table.Load()
	var victim *cell
	var victimTat int64
	freed, seen := 0, 0
	n := t.slots()
	start := rand.IntN(n)
	for k := 0; k < n && seen < samples; k++ {
		c := t.at((start + k) % n)
		if c == nil {
			continue
		}
		seen++
		c.mu.Lock()
		m.claim(c)
		if c.b.full(now) {
			sh.remove(c)
			freed++
		} else if victim == nil || c.b.tat.u < victimTat {
			victim, victimTat = c, c.b.tat.u
		}
		m.release(c)
		c.mu.Unlock()
	}
	if freed == 0 && victim != nil {
		victim.mu.Lock()
		m.claim(victim)
		sh.remove(victim)
		victim.mu.Unlock()
		m.evicted.Add(1)
	}
}

// Validate returns the error of the first unusable option the store was
// made with (such as WithMaxKeys(0)), or nil. The store then works as if
// that option had not been given; middleware.New refuses it.
func (m *Memory) Validate() error { return m.cfgErr }

// Len returns the number of live buckets.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.live
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
// go of the shard's lock every few slots so that requests never wait long.
// A resize meanwhile only makes it visit some buckets twice or not at all.
func (m *Memory) sweep() {
	const batch = 256
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		t := sh.table.Load()
		for k := range t.slots() {
			if c := t.at(k); c != nil {
				c.mu.Lock()
				m.claim(c)
				if c.b.rate != 0 && c.b.full(m.nowUs()) {
					sh.remove(c)
				}
				m.release(c)
				c.mu.Unlock()
			}
			if k%batch == batch-1 {
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

// keyHash returns the 64-bit hash of key, seeded per store. On 64-bit
// platforms it is the runtime's string hash (AES-based where the CPU has
// it), which hash/maphash.String reaches through wrappers that cost about
// as much as hashing a short key; elsewhere it is maphash.String.
func (m *Memory) keyHash(key string) uint64 {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		return uint64(memhash(unsafe.Pointer(unsafe.StringData(key)), m.seed64, uintptr(len(key))))
	}
	return maphash.String(m.seed, key)
}

// memhash is the runtime's hash of s bytes at p with seed h. The runtime
// keeps this name for packages that link to it.
//
//go:linkname memhash runtime.memhash
//go:noescape
func memhash(p unsafe.Pointer, h, s uintptr) uintptr

// shardOf returns the shard of a key whose hash is h. Its top bits choose
// the shard; the low bits index the shard's table.
func (m *Memory) shardOf(h uint64) *memShard {
	return &m.shards[uint32(h>>32)&m.mask]
}

func costError(key string, limit Limit, cost int) error {
	return fmt.Errorf("store: take %q: %w: cost %d is outside [0, %d] (Burst of %v)", key, ErrInvalidCost, cost, limit.Burst, limit)
}

// TakeAll implements [MultiStore]: the shards of all the keys are locked
// together (in shard order, so that concurrent calls cannot deadlock), then
// their buckets, for one instant of the clock.
func (m *Memory) TakeAll(_ context.Context, reqs []Request) ([]Result, error) {
	ps, err := checkRequests(reqs)
	if err != nil {
		return nil, err
	}
	lps := make([]*limitParams, len(reqs)) // for new buckets
	for i, q := range reqs {
		if lps[i], err = m.limitParams(q.Limit); err != nil {
			return nil, err
		}
	}
	keys := make([]string, len(reqs))
	hs := make([]uint64, len(reqs))
	idx := make([]uint32, 0, len(reqs))
	for i, q := range reqs {
		keys[i] = q.Key
		if len(keys[i]) > maxKeyLen {
			keys[i] = hashKey(keys[i])
		}
		hs[i] = m.keyHash(keys[i])
		s := uint32(hs[i]>>32) & m.mask
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
	// With every shard's lock held, no other call holds two cells, so
	// locking these in any order cannot deadlock.
	cells := make([]*cell, len(reqs))
	for i := range reqs {
		if c := m.shardOf(hs[i]).lookup(hs[i], keys[i]); c != nil {
			c.mu.Lock()
			m.claim(c)
			cells[i] = c
		}
	}

	out := make([]Result, len(reqs))
	next := make([]bucket, len(reqs))
	writes := make([]bool, len(reqs))
	all := true
	for i, q := range reqs {
		var cur bucket
		if cells[i] != nil {
			cur = cells[i].b
		}
		out[i].Limit = q.Limit
		next[i], writes[i] = ps[i].decide(&out[i], cur, cur.has(), now, int64(q.Cost))
		all = all && out[i].Allowed
	}
	if !all {
		// Nothing is taken: describe every bucket as it stands. Only the
		// buckets that denied write, and only the state a larger limit
		// left, read as an empty bucket (see params.decide).
		for i, q := range reqs {
			writes[i] = writes[i] && !out[i].Allowed
			var cur bucket
			if cells[i] != nil {
				cur = cells[i].b
			}
			retry := out[i].RetryAfter
			out[i] = Result{Limit: q.Limit}
			ps[i].decide(&out[i], cur, cur.has(), now, 0)
			out[i].Allowed, out[i].RetryAfter = false, retry
		}
	}
	for i, c := range cells {
		if c == nil {
			continue
		}
		switch {
		case writes[i]:
			c.b = next[i]
		case all && out[i].ResetAfter == 0:
			m.shardOf(hs[i]).remove(c)
		}
		m.release(c)
		c.mu.Unlock()
	}
	if all {
		// New buckets last, once no cell is held: making room may lock some.
		for i, c := range cells {
			if c == nil && writes[i] {
				m.insert(m.shardOf(hs[i]), m.newCell(keys[i], hs[i], lps[i], next[i], now), now)
			}
		}
	}
	return out, nil
}
