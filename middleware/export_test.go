package middleware

import "time"

// SetDenyCacheClock makes l's deny cache read the time from now, a
// monotonic clock, instead of the process's. l must have a deny cache.
func SetDenyCacheClock(l *Limiter, now func() time.Duration) { l.deny.now = now }

// DenyCacheLen returns the number of entries in l's deny cache.
func DenyCacheLen(l *Limiter) int { return l.deny.len() }

func (d *denyCache) len() int {
	n := 0
	for i := range d.shards {
		n += int(d.shards[i].n.Load())
	}
	return n
}

// LocalLen returns the number of buckets in l's FailLocal store.
func LocalLen(l *Limiter) int { return l.local.Len() }

// SetLocalSweep makes FailLocal's store swept every d, until the returned
// function restores the default.
func SetLocalSweep(d time.Duration) (restore func()) {
	old := localSweep
	localSweep = d
	return func() { localSweep = old }
}
