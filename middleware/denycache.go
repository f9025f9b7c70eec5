package middleware

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// denyCache remembers, per store key, the store's last denial: until the
// time the store gave for the denied cost to succeed, a request of that
// cost or more under the same limit is refused locally. A bucket only gains
// tokens with time, and times are read on the monotonic clock after the
// store's reply: an entry can only err late. It is sharded, so that no
// process-wide lock is on the request path, and bounded (see makeRoom).
type denyCache struct {
	shards   []denyShard
	mask     uint64
	shardCap int
	seeds    [2]maphash.Seed
	now      func() time.Duration // the clock; replaced in tests
}

// A denyID names a store key by two seeded 64-bit hashes (a 2^-128 chance
// for two keys to share an entry), whatever the key's length.
type denyID [2]uint64

type denyShard struct {
	mu sync.Mutex
	m  map[denyID]*denyEntry
	n  atomic.Int32 // len(m), read without the lock
	_  [40]byte     // keep shards on separate cache lines
}

// denyEntry is one denial: a request under limit of cost at least cost is
// refused until retryAt. Then the first request that reads it probes the
// store; until its answer (or retryAt + window) the others are refused: the
// tokens that came back are the probe's.
type denyEntry struct {
	limit   store.Limit
	cost    int
	retryAt time.Duration
	resetAt time.Duration // when the bucket is full again
	window  time.Duration // time for cost tokens
	gen     uint64        // changes whenever the entry is recorded again
	probing bool
}

type denyVerdict uint8

const (
	denyMiss  denyVerdict = iota // ask the store
	denyHit                      // refuse locally
	denyProbe                    // ask the store, and report the answer to probed
)

// Bounds of the shard count, a power of two.
const (
	maxDenyShards    = 32
	minDenyShardKeys = 16
	denySamples      = 8 // entries looked at to make room in a full shard
)

var processStart = time.Now()

// monotonicNow returns the time since the process started.
func monotonicNow() time.Duration { return time.Since(processStart) }

func newDenyCache(maxKeys int) *denyCache {
	n := maxDenyShards
	for n > 1 && maxKeys/n < minDenyShardKeys {
		n /= 2
	}
	d := &denyCache{
		shards:   make([]denyShard, n),
		mask:     uint64(n - 1),
		shardCap: maxKeys / n, // at least 1: maxKeys >= 1
		seeds:    [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		now:      monotonicNow,
	}
	for i := range d.shards {
		d.shards[i].m = make(map[denyID]*denyEntry)
	}
	return d
}

func (d *denyCache) lookup(key []byte) (*denyShard, denyID) {
	h := maphash.Bytes(d.seeds[0], key)
	return &d.shards[h&d.mask], denyID{h, maphash.Bytes(d.seeds[1], key)}
}

// check looks key up for a request of cost under lim, without allocating.
// On denyHit, res is the refusal; on denyProbe, gen identifies the entry
// for probed.
func (d *denyCache) check(key []byte, lim store.Limit, cost int) (v denyVerdict, res store.Result, gen uint64) {
	h := maphash.Bytes(d.seeds[0], key)
	sh := &d.shards[h&d.mask]
	if sh.n.Load() == 0 {
		return denyMiss, res, 0 // nobody refused: no lock, no clock, no second hash
	}
	k := denyID{h, maphash.Bytes(d.seeds[1], key)}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[k]
	if e == nil {
		return denyMiss, res, 0
	}
	switch now := d.now(); {
	case now >= e.retryAt+e.window:
		delete(sh.m, k)
		sh.n.Add(-1)
	case e.limit != lim || cost < e.cost: // another bucket, or a cost that may pass
	case now < e.retryAt:
		return denyHit, e.refusal(now, cost, e.retryAt, e.resetAt), 0
	case !e.probing:
		e.probing = true
		return denyProbe, res, e.gen
	default: // the probe presumably took the tokens that came back: refuse as the store would after it
		return denyHit, e.refusal(now, cost, e.retryAt+e.window, e.resetAt+e.window), 0
	}
	return denyMiss, res, 0
}

// refusal is what the store would answer, as far as e knows, to a request
// of cost at now, when e's cost can succeed at retryAt and its bucket is
// full at resetAt.
func (e *denyEntry) refusal(now time.Duration, cost int, retryAt, resetAt time.Duration) store.Result {
	if cost > e.cost { // the extra tokens take longer to come
		retryAt += tokenTime(e.limit, cost-e.cost, false)
	}
	resetAfter := max(resetAt-now, 0)
	return store.Result{
		Limit:      e.limit,
		RetryAfter: retryAt - now,
		ResetAfter: resetAfter,
		// The whole tokens now, fewer than the entry's cost.
		Remaining: min(tokensAt(e.limit, resetAfter), e.cost-1),
	}
}

// tokensAt returns the whole tokens in a bucket of lim that is full again
// in resetAfter: max(0, floor(Burst - resetAfter*Rate/Period)).
func tokensAt(lim store.Limit, resetAfter time.Duration) int {
	if resetAfter <= 0 {
		return lim.Burst
	}
	// 128-bit product: resetAfter*Rate may not fit in 64 bits.
	hi, lo := bits.Mul64(uint64(resetAfter), uint64(lim.Rate))
	if hi >= uint64(lim.Period) {
		return 0 // more than 2^64 tokens missing
	}
	missing, rem := bits.Div64(hi, lo, uint64(lim.Period))
	if rem != 0 {
		missing++ // a token partly refilled is not there yet
	}
	if missing >= uint64(lim.Burst) {
		return 0
	}
	return lim.Burst - int(missing)
}

// tokenTime returns the time in which lim refills cost tokens, rounded up or
// down (the probe rule must not refuse past it).
func tokenTime(lim store.Limit, cost int, up bool) time.Duration {
	hi, lo := bits.Mul64(uint64(cost), uint64(lim.Period))
	if hi >= uint64(lim.Rate) { // cannot happen for a valid limit: refuse nothing extra
		if up {
			return 1<<63 - 1
		}
		return 0
	}
	q, r := bits.Div64(hi, lo, uint64(lim.Rate))
	if up && r > 0 {
		q++
	}
	return time.Duration(q)
}

// denied records the store's denial res of a request of cost under lim,
// replacing any entry of key.
func (d *denyCache) denied(key []byte, lim store.Limit, cost int, res store.Result) {
	if res.RetryAfter <= 0 || cost <= 0 {
		return // nothing to refuse locally
	}
	now := d.now()
	sh, k := d.lookup(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[k]
	if e == nil {
		if len(sh.m) >= d.shardCap {
			d.makeRoom(sh, now)
		}
		e = new(denyEntry)
		sh.m[k] = e
		sh.n.Add(1)
	}
	*e = denyEntry{limit: lim, cost: cost, retryAt: now + res.RetryAfter, resetAt: now + res.ResetAfter,
		window: tokenTime(lim, cost, false), gen: e.gen + 1}
}

// forget drops the entry of key, if any.
func (d *denyCache) forget(key []byte) { d.probed(key, 0) }

// probed drops the entry gen of key, whose probe was not denied, unless it
// has been recorded again since; gen 0 drops any.
func (d *denyCache) probed(key []byte, gen uint64) {
	sh, k := d.lookup(key)
	sh.mu.Lock()
	if e := sh.m[k]; e != nil && (gen == 0 || e.gen == gen) {
		delete(sh.m, k)
		sh.n.Add(-1)
	}
	sh.mu.Unlock()
}

// makeRoom drops, among a sample of a full shard's entries (sh.mu held),
// those that refuse nothing more, or else the one that expires first.
func (d *denyCache) makeRoom(sh *denyShard, now time.Duration) {
	var victim denyID
	var victimUntil time.Duration
	freed, seen := 0, 0
	for k, e := range sh.m { // map iteration starts at a random entry
		if until := e.retryAt + e.window; now >= until {
			delete(sh.m, k)
			freed++
		} else if seen == 0 || until < victimUntil {
			victim, victimUntil = k, until
		}
		if seen++; seen >= denySamples {
			break
		}
	}
	if freed == 0 {
		delete(sh.m, victim)
		freed++
	}
	sh.n.Add(int32(-freed))
}

func (d *denyCache) len() int {
	n := 0
	for i := range d.shards {
		n += int(d.shards[i].n.Load())
	}
	return n
}
