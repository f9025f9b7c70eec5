package middleware

import (
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/store"
)

var fieldsNow = time.Unix(1_700_000_000, 400_000_000)

// checkFields checks that the cache writes what headers.Write (and, for a
// refusal, headers.WriteRetryAfter) writes, on a header where before were
// written first under the profile other: twice, formatted then from the
// table.
func checkFields(t *testing.T, c *fieldCache, other headers.Profile, before []headers.Quota, q headers.Quota, retry time.Duration) {
	t.Helper()
	for _, denied := range []bool{false, true} {
		for range 2 {
			want, got := make(http.Header), make(http.Header)
			for _, o := range before {
				headers.Write(want, other, o, fieldsNow)
				headers.Write(got, other, o, fieldsNow)
			}
			headers.Write(want, c.profile, q, fieldsNow)
			if denied {
				headers.WriteRetryAfter(want, retry)
				c.writeDenied(got, q, retry, fieldsNow)
			} else {
				c.write(got, q, fieldsNow)
			}
			if !equalHeader(got, want) {
				t.Fatalf("%v, %+v after %d quotas under %v (denied %v, retry %v): got %v, want %v",
					c.profile, q, len(before), other, denied, retry, got, want)
			}
		}
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

func TestFieldCacheWritesWhatWriteWrites(t *testing.T) {
	lim := store.Limit{Rate: 100, Period: time.Minute, Burst: 10}
	api := headers.Quota{Name: "api", Limit: 10, Rate: 100, Window: time.Minute, Remaining: 4, Reset: 1500 * time.Millisecond}
	with := func(f func(*headers.Quota)) headers.Quota { q := api; f(&q); return q }
	global := headers.Quota{Name: "global", Limit: 5, Rate: 5, Window: time.Minute, Remaining: 0, Reset: 40 * time.Second}
	for _, p := range []headers.Profile{headers.Default, headers.Draft11, headers.Draft03, headers.XRateLimitDelta,
		headers.Default | headers.XRateLimitDelta, headers.Default | headers.XRateLimitEpoch} {
		c := newFieldCache(p, "api", lim)
		for _, tc := range []struct {
			name   string
			before []headers.Quota
			q      headers.Quota
			retry  time.Duration
		}{
			{"fresh header", nil, api, time.Second},
			{"exhausted, t beyond the retry", nil, with(func(q *headers.Quota) { q.Remaining, q.Reset = 0, 2500*time.Millisecond }), time.Second},
			{"exhausted, retry beyond t", nil, with(func(q *headers.Quota) { q.Remaining = 0 }), 5 * time.Second},
			{"retry of 1ns", nil, with(func(q *headers.Quota) { q.Remaining, q.Reset = 0, 1 }), 1},
			{"retry over 100 s", nil, with(func(q *headers.Quota) { q.Remaining, q.Reset = 0, 150*time.Second }), 150 * time.Second},
			{"negative and huge", nil, with(func(q *headers.Quota) { q.Remaining, q.Reset = -3, 1<<62 }), time.Second},
			{"another limiter first", []headers.Quota{global}, api, time.Second},
			{"the same policy first", []headers.Quota{api}, api, time.Second},
			{"a FailLocal share", nil, with(func(q *headers.Quota) { q.Limit = 5 }), time.Second},
		} {
			t.Run(p.String()+"/"+tc.name, func(t *testing.T) {
				for _, other := range []headers.Profile{headers.Default, headers.XRateLimitDelta, headers.XRateLimitEpoch} {
					checkFields(t, c, other, tc.before, tc.q, tc.retry)
				}
			})
		}
	}
}

func TestFieldCacheCollisionsAndAdd(t *testing.T) {
	c := newFieldCache(headers.Default, "api", store.Limit{Rate: 1000, Period: time.Minute, Burst: 1000})
	for round := range 2 {
		for r := range 2 * len(c.slots) {
			q := headers.Quota{Name: "api", Limit: 1000, Rate: 1000, Window: time.Minute, Remaining: r, Reset: time.Duration(r%7) * time.Second}
			checkFields(t, c, headers.Default, nil, q, time.Second)
			if round == 0 { // an Add to one response must not reach the next
				h := make(http.Header)
				c.write(h, q, fieldsNow)
				for k := range h {
					h.Add(k, "appended")
				}
			}
		}
	}
}

func TestFieldCacheConcurrent(t *testing.T) {
	c := newFieldCache(headers.Default, "api", store.Limit{Rate: 100, Period: time.Minute, Burst: 100})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				r := (g*31 + i) % 101
				h := make(http.Header)
				c.write(h, headers.Quota{Name: "api", Limit: 100, Rate: 100, Window: time.Minute, Remaining: r, Reset: time.Duration(i%3) * time.Second}, fieldsNow)
				if got, want := h.Get("Ratelimit-Remaining"), strconv.Itoa(r); got != want {
					t.Errorf("RateLimit-Remaining %q, want %q", got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// FuzzFieldCache checks the cache against headers.Write for any quota and
// profile, alone and after another limiter's fields.
func FuzzFieldCache(f *testing.F) {
	f.Add(uint8(headers.Default), int64(100), int64(time.Minute), int64(10), int64(4), int64(1500*time.Millisecond), int64(time.Second), false)
	f.Add(uint8(headers.Draft03|headers.XRateLimitDelta), int64(1), int64(time.Millisecond), int64(1), int64(0), int64(1<<62), int64(-1), true)
	f.Fuzz(func(t *testing.T, p uint8, rate, period, burst, remaining, reset, retry int64, others bool) {
		profile := headers.Profile(p)
		if profile.Validate() != nil || profile == 0 {
			return
		}
		lim := store.Limit{Rate: int(rate), Period: time.Duration(period), Burst: int(burst)}
		c := newFieldCache(profile, "api", lim)
		q := headers.Quota{Name: "api", Limit: lim.Burst, Rate: lim.Rate, Window: lim.Period, Remaining: int(remaining), Reset: time.Duration(reset)}
		var before []headers.Quota
		if others {
			before = []headers.Quota{{Name: "global", Limit: 5, Rate: 5, Window: time.Second, Remaining: 0, Reset: 3 * time.Second}}
		}
		checkFields(t, c, headers.Default, before, q, time.Duration(retry))
	})
}
