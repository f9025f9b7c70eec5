package headers

import (
	"net/http"
	"testing"
	"time"
)

var (
	benchUser   = Quota{Name: "per-user", Limit: 100, Window: time.Minute, Remaining: 42, Reset: 600 * time.Millisecond}
	benchGlobal = Quota{Name: "global", Limit: 5000, Window: time.Second, Remaining: 4211}
)

// BenchmarkWrite measures Write as the middleware calls it, on every
// response. The header is cleared (not reallocated) between iterations, so
// the numbers are Write's own cost; "new header" adds a make(http.Header)
// per iteration, as net/http does per response.
func BenchmarkWrite(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	b.Run("Default/one quota", func(b *testing.B) {
		b.ReportAllocs()
		h := make(http.Header)
		for i := 0; i < b.N; i++ {
			clear(h)
			Write(h, Default, benchUser, now)
		}
	})
	b.Run("Default/one quota, new header", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			h := make(http.Header)
			Write(h, Default, benchUser, now)
		}
	})
	b.Run("Default/two quotas", func(b *testing.B) {
		b.ReportAllocs()
		h := make(http.Header)
		for i := 0; i < b.N; i++ {
			clear(h)
			Write(h, Default, benchUser, now)
			Write(h, Default, benchGlobal, now)
		}
	})
	b.Run("Default|XRateLimitEpoch/one quota", func(b *testing.B) {
		b.ReportAllocs()
		h := make(http.Header)
		for i := 0; i < b.N; i++ {
			clear(h)
			Write(h, Default|XRateLimitEpoch, benchUser, now)
		}
	})
	b.Run("Default/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			h := make(http.Header)
			for pb.Next() {
				clear(h)
				Write(h, Default, benchUser, now)
			}
		})
	})
}

func BenchmarkWriteRetryAfter(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	h := make(http.Header)
	Write(h, Default, Quota{Name: "per-user", Limit: 100, Window: time.Minute, Reset: 600 * time.Millisecond}, now)
	Write(h, Default, benchGlobal, now)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		WriteRetryAfter(h, time.Second)
	}
}
