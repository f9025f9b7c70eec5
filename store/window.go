package store

import (
	"cmp"
	"strconv"
	"sync"
	"time"
)

// Window makes a [Limit] a quota of Rate (= Burst) per window instead of a
// token bucket: [Fixed], [Sliding] or [Monthly], or one of them In a
// Location. A count is kept per key and window kind, apart from the key's
// bucket. Redis decides on its clock: it finds windows from the epoch
// itself, and picks a calendar window among three computed around the app's
// clock, so for those the two must agree within a window: a call whose
// windows Redis's clock is past (a clock or a queue a window late) is
// refused. (A pointer keeps a Limit four words: a fifth cost a fifth of a
// Memory decision on one hot key.)
type Window struct {
	kind uint8 // fixed, sliding or monthly; 0: not a window (an error)
	loc  *time.Location
}

const (
	fixed = 1 + iota
	sliding
	monthly
)

var (
	// Fixed counts Rate per window of Period (at most 2^50 µs) from the
	// Unix epoch; In a Location, with a Period that divides a day, from each
	// local midnight (a day's last window ends at the next one, across DST).
	Fixed = &Window{kind: fixed}
	// Sliding counts the current window of Period plus the previous one's
	// count weighted by its share still within a Period of now, rounded
	// down; Rate*Period in µs at most 2^50, no Location.
	Sliding = &Window{kind: sliding}
	// Monthly counts Rate per calendar month (UTC, or In a Location); Period 0.
	Monthly = &Window{kind: monthly}
)

var zones sync.Map // Window{kind, loc} → *Window: one per kind and Location

// In returns w in loc's calendar (nil: UTC), the same pointer for the same
// w and loc, so that Limits using it compare equal.
func (w *Window) In(loc *time.Location) *Window {
	if loc == nil {
		return w
	}
	v, _ := zones.LoadOrStore(Window{w.kind, loc}, &Window{kind: w.kind, loc: loc})
	return v.(*Window)
}

// Location returns w's calendar: nil for UTC.
func (w *Window) Location() *time.Location { return w.loc }

func (w *Window) String() string {
	if w == nil {
		return "bucket"
	}
	if w.kind < fixed || w.kind > monthly {
		return "Window(" + strconv.Itoa(int(w.kind)) + ")"
	}
	return [...]string{"fixed", "sliding", "monthly"}[w.kind-1]
}

// FixedWindow returns a quota of n per window of period from the Unix epoch.
func FixedWindow(n int, period time.Duration) Limit {
	return Limit{Rate: n, Period: period, Burst: n, Window: Fixed}
}

// SlidingWindow returns a sliding-window quota of n per period.
func SlidingWindow(n int, period time.Duration) Limit {
	return Limit{Rate: n, Period: period, Burst: n, Window: Sliding}
}

// PerDayIn returns a quota of n per calendar day in loc (nil: UTC).
func PerDayIn(n int, loc *time.Location) Limit {
	return Limit{Rate: n, Period: 24 * time.Hour, Burst: n, Window: Fixed.In(loc)}
}

// PerMonthIn returns a quota of n per calendar month in loc (nil: UTC).
func PerMonthIn(n int, loc *time.Location) Limit {
	return Limit{Rate: n, Burst: n, Window: Monthly.In(loc)}
}

// windowParams checks a window quota and returns its params: a token is one
// count, cap = Rate.
func windowParams(l Limit) (*params, error) {
	n, us, w := int64(l.Rate), l.Period.Microseconds(), l.Window
	switch {
	case w.kind < fixed || w.kind > monthly:
		return nil, l.invalid("unknown Window: use store.Fixed, Sliding or Monthly")
	case l.Rate < 1 || n > maxProduct:
		return nil, l.invalid("Rate must be in [1, 2^50], got %d", l.Rate)
	case l.Burst != l.Rate:
		return nil, l.invalid("a window's Burst must equal its Rate, got %d", l.Burst)
	case w.kind == monthly && l.Period != 0:
		return nil, l.invalid("a monthly window's Period must be 0 (the calendar sets it), got %s", l.Period)
	case w.kind != monthly && (l.Period < time.Microsecond || l.Period%time.Microsecond != 0 || us > maxProduct):
		return nil, l.invalid("Period must be a positive whole number of microseconds, at most 2^50, got %s", l.Period)
	case w.kind == sliding && w.loc != nil:
		return nil, l.invalid("a sliding window has no Location")
	case w.kind == fixed && w.loc != nil && (24*time.Hour)%l.Period != 0:
		return nil, l.invalid("a fixed window in a Location needs a Period that divides a day, got %s", l.Period)
	case w.kind == sliding && n > maxProduct/us:
		return nil, l.invalid("Rate*Period in µs must not exceed 2^50")
	}
	p := &params{l: l, q: 1, t: 1, cap: n, fit: n, fitUs: n + 1, args: [2]any{n, int64(0)}, k1: int64(1), period: us, loc: w.loc}
	p.spec = "fsm"[w.kind-1 : w.kind]
	switch w.kind {
	case sliding:
		p.args[1] = int64(-1)
		fallthrough
	case fixed:
		p.spec += strconv.FormatInt(us, 10)
	case monthly:
		p.loc = cmp.Or(p.loc, time.UTC)
	}
	if p.loc == nil {
		p.epoch = [2]any{p.args[1].(int64) - 2, us}
	} else { // its name and offsets: "Local" or an unnamed FixedZone is not one zone
		p.spec += "@" + strconv.Quote(p.loc.String())
		for _, mo := range []time.Month{time.January, time.July} {
			_, off := time.Date(2025, mo, 1, 0, 0, 0, 0, p.loc).Zone()
			p.spec += "," + strconv.Itoa(off)
		}
	}
	return p, nil
}

// bounds returns, around the wall instant now (µs), the starts of the
// window before the one holding it, of that one and the next, and the next
// one's end: the windows among which Redis's clock picks.
func (p *params) bounds(now int64) [4]int64 {
	if p.loc == nil { // windows of Period from the epoch
		s := now - now%p.period
		if now < 0 && now%p.period != 0 {
			s -= p.period
		}
		return [4]int64{s - p.period, s, s + p.period, s + 2*p.period}
	}
	s, e := p.around(now)
	b0, _ := p.around(s - 1)
	_, b3 := p.around(e)
	return [4]int64{b0, s, e, b3}
}

// around returns the calendar window [s, e) holding now in p's Location.
func (p *params) around(now int64) (s, e int64) {
	t := time.UnixMicro(now).In(p.loc)
	y, mo, d := t.Date()
	if p.l.Window.kind == monthly {
		return midnight(y, mo, 1, p.loc), midnight(y, mo+1, 1, p.loc)
	}
	day, next := midnight(y, mo, d, p.loc), midnight(y, mo, d+1, p.loc)
	last := (24*time.Hour).Microseconds()/p.period - 1 // the day's last window ends at the next midnight
	i := min((now-day)/p.period, last)
	if s, e = day+i*p.period, next; i < last {
		e = min(s+p.period, next)
	}
	return s, e
}

// midnight returns the first instant of the local day (y, mo, d) in loc: the
// change in a zone whose clocks skip 00:00 (a change at midnight, a day skipped).
func midnight(y int, mo time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, mo, d, 0, 0, 0, 0, loc)
	ty, tm, td := t.Date()
	day, got := time.Date(y, mo, d, 0, 0, 0, 0, time.UTC), time.Date(ty, tm, td, 0, 0, 0, 0, time.UTC)
	switch start, end := t.ZoneBounds(); {
	case got.Before(day): // t is before the change, on the day before
		t = end
	case got.Equal(day) && t.Hour() != 0: // t is after the change
		t = start
	}
	return t.UnixMicro()
}

// A win is a window quota's state: cur counted in the window from start,
// prev in the one before (a sliding window's).
type win struct{ start, prev, cur int64 }

// A winView is a window quota at an instant: now within [s, e) (real: the
// clock's reading), mid if that is b's middle window, and counts; far: counts
// of a window past b's.
type winView struct {
	now, real, s, e, prev, cur int64
	mid, far                   bool
}

// view picks among b the window holding now (the first or last if none
// does, now moved into it) and reads w's counts in it. A state of a later
// window (a clock gone back) is decided in that window, at its start, if b
// holds it; else it is far: nothing is taken or given back. A stale clock
// may deny, never give back.
func (p *params) view(w win, b [4]int64, now int64) winView {
	v := pick(b, now)
	for i := 1; i < 3 && w.start > v.s; i++ { // from a later window: decided there, at its start
		if w.start == b[i] {
			v.s, v.e, v.now, v.mid = b[i], b[i+1], b[i], i == 1
		}
	}
	switch {
	case w.start >= v.s:
		v.prev, v.cur, v.far = w.prev, w.cur, w.start > v.s
	case p.l.Window.kind == sliding && w.start == v.s-(v.e-v.s):
		v.prev = w.cur
	}
	return v
}

// pick returns the window of b holding now, with no counts.
func pick(b [4]int64, now int64) winView {
	v := winView{real: now, s: b[0], e: b[1]}
	for i := 1; i < 3 && now >= b[i]; i++ {
		v.s, v.e, v.mid = b[i], b[i+1], i == 1
	}
	v.now = min(max(now, v.s), v.e-1)
	return v
}

// count is v's count: the current window's, plus a sliding window's share
// of the previous one, rounded down (exact: Rate*Period <= 2^50).
func (p *params) count(v winView) int64 {
	if p.l.Window.kind != sliding || v.prev == 0 {
		return v.cur
	}
	return v.cur + v.prev*(v.e-v.now)/(v.e-v.s)
}

// fitsWindow reports whether k counts fit in v; far ones never do: their
// window and expiry are unknown here.
func (p *params) fitsWindow(v winView, k int64) bool {
	return k <= 0 || !v.far && p.count(v)+k <= p.cap
}

// applyWindow adds k fitting counts to v, and returns v and the state after
// it (changed false: none to write). A k < 0 gives back, not below 0, only in
// b's middle window, which the caller makes the window of the take.
func (p *params) applyWindow(w win, v winView, k int64) (after winView, next win, changed bool) {
	cur := v.cur
	if k > 0 || v.mid && !v.far {
		cur = max(v.cur+k, 0)
	}
	changed = cur != v.cur
	v.cur = cur
	if p.l.Window.kind != sliding {
		v.prev = 0
	}
	return v, win{max(w.start, v.s), v.prev, v.cur}, changed
}

// ttl is how long a window's state matters after v, from the clock's
// reading: to its window's end, a sliding one's a Period more.
func (p *params) ttl(v winView) int64 {
	if p.l.Window.kind == sliding {
		return max(v.e-v.real+(v.e-v.s), 1)
	}
	return max(v.e-v.real, 1)
}

// fillWindow puts in res the Result of a window quota after a decision of k
// counts: RetryAfter until k fit (0: now), ResetAfter until the count is 0.
func (p *params) fillWindow(res *Result, v winView, k int64, allowed bool) {
	n, left, length, elapsed := p.cap, v.e-v.now, v.e-v.s, v.now-v.s
	*res = Result{Limit: p.l, Allowed: allowed, Remaining: int(max(n-p.count(v), 0))}
	fits := p.fitsWindow(v, k)
	switch {
	case p.l.Window.kind != sliding:
		if v.cur > 0 {
			res.ResetAfter, res.Next = micros(left), micros(left)
		}
		if !allowed && !fits {
			res.RetryAfter = micros(left)
		}
		return
	case v.cur > 0:
		res.ResetAfter = micros(left + decayed(v.cur, 0, length))
	default:
		res.ResetAfter = micros(max(decayed(v.prev, 0, length)-elapsed, 0))
	}
	if w := p.count(v) - v.cur; w > 0 { // the previous window's share falls first
		res.Next = micros(decayed(v.prev, w-1, length) - elapsed)
	} else if v.cur > 0 { // then, in the next window, this one's
		res.Next = micros(left + decayed(v.cur, v.cur-1, length))
	}
	switch m := n - v.cur - k; {
	case allowed || fits:
	case v.far: // counts of a window past this one's: retry once this one ends
		res.RetryAfter = micros(left)
	case m >= 0: // within this window, as the previous one's share shrinks
		res.RetryAfter = micros(max(decayed(v.prev, m, length)-elapsed, 1))
	default: // in the next, this one's count its previous
		res.RetryAfter = micros(left + decayed(v.cur, n-k, length))
	}
}

// decayed is the least elapsed time e in [0, w] of a window of length w at
// which a previous count c weighs at most m: floor(c*(w-e)/w) <= m.
func decayed(c, m, w int64) int64 {
	if c <= m {
		return 0
	}
	return w - ceilDiv((m+1)*w, c) + 1
}

// WindowAt returns the window [start, end) of a window quota l that holds t.
// A token bucket, or an invalid l, has none: both are t.
func (l Limit) WindowAt(t time.Time) (start, end time.Time) {
	p, err := newParams(l)
	if err != nil || p.spec == "" {
		return t, t
	}
	b := p.bounds(t.UnixMicro())
	return time.UnixMicro(b[1]).In(t.Location()), time.UnixMicro(b[2]).In(t.Location())
}
