package middleware

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// denyCache remembers per store key the store's last denial: until its Retry-After, a request of that
// cost or more under the same limit is refused locally. Tokens only come back with time, and times
// are read after the store's reply: an entry can only err late. Sharded and bounded (makeRoom).
type denyCache struct {
	shards   []denyShard // a power of two
	shardCap int
	seeds    [2]maphash.Seed
	now      func() time.Duration // the clock; replaced in tests
}

// A denyID is a store key's two seeded 64-bit hashes: 2^-128 odds of a clash.
type denyID [2]uint64

type denyShard struct {
	mu sync.Mutex
	m  map[denyID]*denyEntry
	n  atomic.Int32 // len(m), read without the lock
	_  [40]byte     // keep shards on separate cache lines
}

// denyEntry is one denial: a request under limit of cost at least cost is refused until retryAt;
// then one probes; until its answer (or retryAt + window) the others are refused: the tokens are its.
type denyEntry struct {
	limit   store.Limit
	cost    int
	retryAt time.Duration
	resetAt time.Duration // the bucket is full again
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
	return &d.shards[h&uint64(len(d.shards)-1)], denyID{h, maphash.Bytes(d.seeds[1], key)}
}

// check looks key up for cost under lim without allocating: res is denyHit's refusal, gen denyProbe's.
func (d *denyCache) check(key []byte, lim store.Limit, cost int) (v denyVerdict, res store.Result, gen uint64) {
	h := maphash.Bytes(d.seeds[0], key)
	sh := &d.shards[h&uint64(len(d.shards)-1)]
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

// refusal is the store's answer, as far as e knows, to a request of cost at now, when e's cost can
// succeed at retryAt and its bucket is full at resetAt.
func (e *denyEntry) refusal(now time.Duration, cost int, retryAt, resetAt time.Duration) store.Result {
	retryAt += tokenTime(e.limit, cost-e.cost, false) // the tokens beyond e.cost
	resetAfter := max(resetAt-now, 0)
	return store.Result{Limit: e.limit, RetryAfter: retryAt - now, ResetAfter: resetAfter,
		Remaining: min(tokensAt(e.limit, resetAfter), e.cost-1)}
}

// tokensAt returns the whole tokens in a bucket of lim that is full again in resetAfter.
func tokensAt(lim store.Limit, resetAfter time.Duration) int {
	if resetAfter <= 0 {
		return lim.Burst
	}
	missing, ok := mulDiv(uint64(resetAfter), uint64(lim.Rate), uint64(lim.Period), true)
	if !ok || missing >= uint64(lim.Burst) {
		return 0
	}
	return lim.Burst - int(missing)
}

// tokenTime returns the time in which lim refills cost tokens, rounded up or down.
func tokenTime(lim store.Limit, cost int, up bool) time.Duration {
	t, ok := mulDiv(uint64(cost), uint64(lim.Period), uint64(lim.Rate), up)
	if !ok && up { // not for a valid limit
		return 1<<63 - 1
	}
	return time.Duration(t)
}

// mulDiv returns a*b/c rounded up or down, or false if it overflows 64 bits.
func mulDiv(a, b, c uint64, up bool) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return 0, false
	}
	q, r := bits.Div64(hi, lo, c)
	if up && r > 0 {
		q++
	}
	return q, true
}

// denied records the store's denial res of key at cost under lim.
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

// probed drops key's entry gen, whose probe was not denied; gen 0 drops any.
func (d *denyCache) probed(key []byte, gen uint64) {
	sh, k := d.lookup(key)
	sh.mu.Lock()
	if e := sh.m[k]; e != nil && (gen == 0 || e.gen == gen) {
		delete(sh.m, k)
		sh.n.Add(-1)
	}
	sh.mu.Unlock()
}

// makeRoom drops sampled entries of a full, locked sh that refuse nothing, else the first to expire.
func (d *denyCache) makeRoom(sh *denyShard, now time.Duration) {
	var victim denyID
	var victimUntil time.Duration
	seen := 0
	for k, e := range sh.m { // map iteration starts at a random entry
		if until := e.retryAt + e.window; now >= until {
			delete(sh.m, k)
		} else if seen == 0 || until < victimUntil {
			victim, victimUntil = k, until
		}
		if seen++; seen >= denySamples {
			break
		}
	}
	if len(sh.m) >= d.shardCap { // nothing freed
		delete(sh.m, victim)
	}
	sh.n.Store(int32(len(sh.m)))
}
