package headers

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// cacheSlots is the number of (remaining, reset) pairs a [Cache] keeps
// formatted. At any moment most responses of a policy share a few pairs (a
// full bucket, an empty one, the first tokens of a burst), so a small table
// serves nearly all of them.
const (
	cacheBits  = 8
	cacheSlots = 1 << cacheBits
)

// Cache writes the fields of one policy, a fixed name, limit and window, as
// [Write] does, but formats each value once: the RateLimit-Policy item and
// the limit when it is made, and the values that depend on Remaining and
// Reset once per (remaining, reset) pair, which it keeps in a small table
// for the next responses that report the same pair. A Write served from the
// table formats nothing and allocates nothing; one that is not allocates
// twice, as Write does.
//
// The field slices it puts in a header are shared by every response it
// writes: code after it must replace a field (as [http.Header.Set], Add and
// Del do), never assign into the slice it holds. Write and the rest of
// this package only ever replace fields.
//
// A Cache is safe for concurrent use on different headers. Build it with
// [NewCache].
type Cache struct {
	profile Profile
	name    string
	limit   int
	rate    int
	window  time.Duration
	fast    bool     // the profile writes nothing that depends on the time of day
	policy  []string // the RateLimit-Policy value
	limitV  []string // the Limit value of the single-value fields
	slots   [cacheSlots]atomic.Pointer[cacheEntry]
	retry   [retrySlots]atomic.Pointer[retryValue]
}

// cacheEntry holds the values of one (remaining, reset) pair: the
// RateLimit item, then Remaining and Reset of the single-value fields, all
// slices of one string.
type cacheEntry struct {
	remaining, reset int64 // as written: clamped, and in seconds
	vals             [3]string
}

// NewCache returns a Cache for the policy name with the given limit, rate and
// window, written under profile p (see [Write]).
func NewCache(p Profile, name string, limit, rate int, window time.Duration) *Cache {
	c := &Cache{
		profile: p,
		name:    name,
		limit:   limit,
		rate:    rate,
		window:  window,
		fast:    p&XRateLimitEpoch == 0,
		limitV:  []string{strconv.FormatInt(clampInt(limit), 10)},
	}
	q := Quota{Name: name, Limit: limit, Rate: rate, Window: window}
	c.policy = []string{string(appendItem(nil, &q, true))}
	return c
}

// WriteDenied adds q to h and sets Retry-After for a refusal that can be
// retried in retryAfter, exactly as Write followed by [WriteRetryAfter]
// would. When h holds none of the rate-limit fields, Retry-After follows
// from q without reading the header back, and is taken from a table for
// delays under 100 seconds.
func (c *Cache) WriteDenied(h http.Header, q Quota, retryAfter time.Duration, now time.Time) {
	c.writeDenied(h, q, retryAfter, now, time.Now)
}

// writeDenied is WriteDenied with the clock of WriteRetryAfter as a
// parameter, read only when WriteRetryAfter is called.
func (c *Cache) writeDenied(h http.Header, q Quota, retryAfter time.Duration, now time.Time, clock func() time.Time) {
	reset := Seconds(q.Reset)
	if !c.fast || q.Limit != c.limit || q.Rate != c.rate || q.Window != c.window || q.Name != c.name || !c.alone(h) ||
		c.profile&XRateLimitDelta != 0 && reset >= epochThreshold { // would be read back as a Unix time
		c.Write(h, q, now)
		writeRetryAfter(h, retryAfter, clock())
		return
	}
	c.write(h, q)
	secs := max(Seconds(retryAfter), 1)
	if c.profile&(Draft11|Draft03|XRateLimitDelta) != 0 && clampInt(q.Remaining) == 0 {
		secs = max(secs, reset) // the t of our exhausted quota, as WriteRetryAfter reads it
	}
	h[keyRetryAfter] = c.retryAfter(secs)
}

// retryAfter returns the Retry-After value of secs: from a table shared by
// every Cache under 100 seconds, otherwise from the Cache's own table of
// recent values (a refusal for a long time counts down a second at a time,
// and most responses of one second share it).
func (c *Cache) retryAfter(secs int64) []string {
	if secs < int64(len(smallSeconds)) {
		return smallSeconds[secs][:1:1]
	}
	slot := &c.retry[uint64(secs)%retrySlots]
	if e := slot.Load(); e != nil && e.secs == secs {
		return e.v[:1:1]
	}
	e := &retryValue{secs: secs, v: [1]string{strconv.FormatInt(secs, 10)}}
	slot.Store(e)
	return e.v[:1:1]
}

// smallSeconds holds the values of Retry-After under 100 seconds.
var smallSeconds = func() (v [100][1]string) {
	for i := range v {
		v[i][0] = strconv.Itoa(i)
	}
	return v
}()

// retrySlots is the size of a Cache's table of Retry-After values.
const retrySlots = 16

type retryValue struct {
	secs int64
	v    [1]string
}

// alone reports whether h holds no rate-limit field at all (of any set,
// whether the profile writes it or not), so that after Write it holds q's
// alone, which is all WriteRetryAfter would read.
func (c *Cache) alone(h http.Header) bool {
	return len(h[keyPolicy]) == 0 && len(h[keyRateLimit]) == 0 && trioAbsent(h, &draft03Keys) && trioAbsent(h, &xKeys)
}

// Write adds q to h under the Cache's profile, exactly as
// Write(h, profile, q, now) would. It takes the formatted values from the
// Cache when q is the Cache's policy (same Name, Limit, Rate and Window), the
// profile does not include [XRateLimitEpoch], and h holds none of the
// fields to write, so that there is nothing to merge; otherwise it calls
// [Write].
func (c *Cache) Write(h http.Header, q Quota, now time.Time) {
	if !c.fast || q.Limit != c.limit || q.Rate != c.rate || q.Window != c.window || q.Name != c.name || !c.absent(h) {
		Write(h, c.profile, q, now)
		return
	}
	c.write(h, q)
}

// write sets the fields of q, the Cache's policy, in h, which holds none
// of them.
func (c *Cache) write(h http.Header, q Quota) {
	e := c.entry(clampInt(q.Remaining), Seconds(q.Reset))
	// Full slice expressions: an Add to one field must not overwrite the
	// next value, which another response shares.
	if c.profile&Draft11 != 0 {
		h[keyPolicy] = c.policy
		h[keyRateLimit] = e.vals[0:1:1]
	}
	if c.profile&Draft03 != 0 {
		c.setTrio(h, e, &draft03Keys)
	}
	if c.profile&XRateLimitDelta != 0 {
		c.setTrio(h, e, &xKeys)
	}
}

func (c *Cache) setTrio(h http.Header, e *cacheEntry, keys *trioKeys) {
	h[keys.limit] = c.limitV
	h[keys.remaining] = e.vals[1:2:2]
	h[keys.reset] = e.vals[2:3:3]
}

// absent reports whether h holds none of the fields the profile writes, so
// that Write would write each of them afresh: a List field without lines
// gets the item alone, and single-value fields of which one is missing are
// all replaced.
func (c *Cache) absent(h http.Header) bool {
	if c.profile&Draft11 != 0 && (len(h[keyPolicy]) != 0 || len(h[keyRateLimit]) != 0) {
		return false
	}
	if c.profile&Draft03 != 0 && !trioAbsent(h, &draft03Keys) {
		return false
	}
	return c.profile&XRateLimitDelta == 0 || trioAbsent(h, &xKeys)
}

func trioAbsent(h http.Header, keys *trioKeys) bool {
	return len(h[keys.limit]) == 0 && len(h[keys.remaining]) == 0 && len(h[keys.reset]) == 0
}

// entry returns the values of (remaining, reset), from the table or newly
// formatted. Two Writes that miss on one slot at once both format, and the
// last one stays: the table is a cache, never a source of truth.
func (c *Cache) entry(remaining, reset int64) *cacheEntry {
	slot := &c.slots[slotOf(remaining, reset)]
	if e := slot.Load(); e != nil && e.remaining == remaining && e.reset == reset {
		return e
	}
	var stack [128]byte
	b := appendRateLimitItem(stack[:0], c.name, remaining, reset)
	item := len(b)
	b = strconv.AppendInt(b, remaining, 10)
	rem := len(b)
	b = strconv.AppendInt(b, reset, 10)
	s := string(b)
	e := &cacheEntry{remaining: remaining, reset: reset, vals: [3]string{s[:item], s[item:rem], s[rem:]}}
	slot.Store(e)
	return e
}

// slotOf spreads (remaining, reset) pairs over the table: a multiplicative
// hash, whose top bits are the slot.
func slotOf(remaining, reset int64) uint64 {
	h := uint64(remaining)*0x9e3779b97f4a7c15 ^ uint64(reset)*0xc2b2ae3d27d4eb4f
	h *= 0x9e3779b97f4a7c15
	return h >> (64 - cacheBits)
}
