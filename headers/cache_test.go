package headers

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/internal/race"
)

func TestCacheWritesWhatWriteWrites(t *testing.T) {
	api := Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 42, Reset: 1500 * time.Millisecond}
	for _, p := range []Profile{Default, Draft11, Draft03, XRateLimitDelta, Default | XRateLimitDelta, Default | XRateLimitEpoch, 0} {
		c := NewCache(p, api.Name, api.Limit, api.Rate, api.Window)
		for _, tc := range []struct {
			name   string
			before []Quota // written with Write before the Cache writes api
			q      Quota
		}{
			{"fresh header", nil, api},
			{"fresh header again, from the table", nil, api},
			{"another pair", nil, Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 0, Reset: 600 * time.Millisecond}},
			{"negative and huge values", nil, Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: -3, Reset: 1 << 62}},
			{"another limiter wrote first", []Quota{{Name: "global", Limit: 5000, Window: time.Second, Remaining: 7}}, api},
			{"same policy written first", []Quota{api}, api},
			{"another limit", nil, Quota{Name: "api", Limit: 10, Window: time.Minute, Remaining: 1}},
			{"another window", nil, Quota{Name: "api", Limit: 100, Window: time.Hour, Remaining: 1}},
			{"another name", nil, Quota{Name: "other", Limit: 100, Window: time.Minute, Remaining: 1}},
		} {
			want, got := make(http.Header), make(http.Header)
			for _, q := range tc.before {
				Write(want, Default, q, epoch)
				Write(got, Default, q, epoch)
			}
			Write(want, p, tc.q, epoch)
			c.Write(got, tc.q, epoch)
			if !equalHeader(got, want) {
				t.Errorf("%v, %s: got %q, want %q", p, tc.name, fields(got), fields(want))
			}
		}
	}
}

func TestCacheSharedValuesSurviveAdd(t *testing.T) {
	c := NewCache(Default, "api", 100, 0, time.Minute)
	q := Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 42, Reset: time.Second}
	h1 := make(http.Header)
	c.Write(h1, q, epoch)
	for k := range h1 {
		h1.Add(k, "appended") // must copy, not write into the shared array
	}
	h2 := make(http.Header)
	c.Write(h2, q, epoch)
	if want := writeAll(Default, epoch, q); !equalHeader(h2, want) {
		t.Errorf("after an Add to another response: got %q, want %q", fields(h2), fields(want))
	}
}

func TestCacheCollisions(t *testing.T) {
	// More pairs than slots: every pair is still written right.
	c := NewCache(Default, "api", 1000, 0, time.Minute)
	for round := range 2 {
		for r := range 2 * cacheSlots {
			q := Quota{Name: "api", Limit: 1000, Window: time.Minute, Remaining: r, Reset: time.Duration(r%7) * time.Second}
			got := make(http.Header)
			c.Write(got, q, epoch)
			if want := writeAll(Default, epoch, q); !equalHeader(got, want) {
				t.Fatalf("round %d, pair %d: got %q, want %q", round, r, fields(got), fields(want))
			}
		}
	}
}

func TestCacheConcurrent(t *testing.T) {
	c := NewCache(Default, "api", 100, 0, time.Minute)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				r := (g*31 + i) % 101
				q := Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: r, Reset: time.Duration(i%3) * time.Second}
				h := make(http.Header)
				c.Write(h, q, epoch)
				if got, want := h.Get("Ratelimit-Remaining"), strconv.Itoa(r); got != want {
					t.Errorf("RateLimit-Remaining %q, want %q", got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestCacheAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	c := NewCache(Default, "api", 100, 0, time.Minute)
	q := Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 42, Reset: time.Second}
	h := make(http.Header)
	c.Write(h, q, epoch)
	if n := testing.AllocsPerRun(100, func() {
		clear(h)
		c.Write(h, q, epoch)
	}); n != 0 {
		t.Errorf("Cache.Write from the table: %v allocations, want 0", n)
	}
}

func TestCacheWriteDenied(t *testing.T) {
	now := epoch.Add(400 * time.Millisecond)
	for _, p := range []Profile{Default, Draft11, Draft03, XRateLimitDelta, Default | XRateLimitEpoch, 0} {
		for _, tc := range []struct {
			name   string
			before []Quota // written with Write before
			q      Quota
			retry  time.Duration
		}{
			{"exhausted, t longer than the retry", nil, Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 0, Reset: 2500 * time.Millisecond}, time.Second},
			{"exhausted, retry longer", nil, Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 0, Reset: time.Second}, 5 * time.Second},
			{"tokens left (a cost above them)", nil, Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 3, Reset: 9 * time.Second}, 2 * time.Second},
			{"retry of 1ns", nil, Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 0, Reset: 1}, 1},
			{"retry over 100s", nil, Quota{Name: "api", Limit: 100, Window: time.Hour, Remaining: 0, Reset: 150 * time.Second}, 150 * time.Second},
			{"reset read as a Unix time", nil, Quota{Name: "api", Limit: 100, Window: time.Hour, Remaining: 0, Reset: 1_100_000_000 * time.Second}, time.Second},
			{"another limiter's exhausted quota", []Quota{{Name: "global", Limit: 5, Window: time.Minute, Remaining: 0, Reset: 40 * time.Second}},
				Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 0, Reset: time.Second}, time.Second},
		} {
			for _, before := range []Profile{Default, XRateLimitDelta, XRateLimitEpoch} {
				c := NewCache(p, tc.q.Name, tc.q.Limit, tc.q.Rate, tc.q.Window)
				for range 2 {
					want, got := make(http.Header), make(http.Header)
					for _, o := range tc.before {
						Write(want, before, o, now)
						Write(got, before, o, now)
					}
					Write(want, p, tc.q, now)
					writeRetryAfter(want, tc.retry, now)
					c.writeDenied(got, tc.q, tc.retry, now, func() time.Time { return now })
					if !equalHeader(got, want) {
						t.Errorf("%v, %s (others in %v): got %q, want %q", p, tc.name, before, fields(got), fields(want))
					}
				}
			}
		}
	}
}
