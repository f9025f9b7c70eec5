package middleware

import "time"

// SetDenyCacheClock makes l's deny cache read the time from now, a
// monotonic clock, instead of the process's. l must have a deny cache.
func SetDenyCacheClock(l *Limiter, now func() time.Duration) { l.deny.now = now }

// DenyCacheLen returns the number of entries in l's deny cache.
func DenyCacheLen(l *Limiter) int { return l.deny.len() }
