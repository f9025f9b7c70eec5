package headers

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"
)

// FuzzWrite writes one to three quotas with arbitrary names, counts and
// durations under an arbitrary profile, and checks every field against a
// model: the List fields always parse, with one String item per sanitised
// name, in the order of first writing, carrying the last quota of that
// name; the single-value fields hold the tightest quota; Retry-After is at
// least 1 and never earlier than an exhausted quota's t.
func FuzzWrite(f *testing.F) {
	f.Add(uint8(Default), uint8(1), int64(1_700_000_000_250_000_000), int64(time.Second),
		[]byte("per-user"), int64(100), int64(42), int64(time.Minute), int64(1500*time.Millisecond),
		[]byte("global"), int64(1000), int64(0), int64(time.Second), int64(3*time.Second),
		[]byte("per-user"), int64(100), int64(41), int64(time.Minute), int64(time.Second))
	f.Add(uint8(Default|XRateLimitEpoch), uint8(2), int64(-5), int64(-1),
		[]byte("a\"b\\c"), int64(-1), int64(-1), int64(-1), int64(-1),
		[]byte("caf\xc3\xa9"), int64(1<<62), int64(1<<62), int64(1<<62), int64(1<<62),
		[]byte("caf??"), int64(0), int64(0), int64(0), int64(0))
	f.Add(uint8(0xff), uint8(2), int64(0), int64(1),
		[]byte{}, int64(1), int64(0), int64(1), int64(1),
		[]byte{0, '\t', 0x7f, 0xff}, int64(2), int64(0), int64(time.Second+1), int64(time.Second+1),
		[]byte(`"`), int64(3), int64(0), int64(999*time.Millisecond), int64(2*time.Second))
	f.Fuzz(func(t *testing.T, p, n uint8, nowNanos, retry int64,
		name0 []byte, limit0, remaining0, window0, reset0 int64,
		name1 []byte, limit1, remaining1, window1, reset1 int64,
		name2 []byte, limit2, remaining2, window2, reset2 int64,
	) {
		profile := Profile(p)
		now := time.Unix(0, nowNanos)
		all := []Quota{
			{string(name0), int(limit0), 0, time.Duration(window0), int(remaining0), time.Duration(reset0)},
			{string(name1), int(limit1), 0, time.Duration(window1), int(remaining1), time.Duration(reset1)},
			{string(name2), int(limit2), 0, time.Duration(window2), int(remaining2), time.Duration(reset2)},
		}
		quotas := all[:1+int(n)%3]

		h := make(http.Header)
		for _, q := range quotas {
			Write(h, profile, q, now)
		}

		m := newModel(profile, now, quotas)
		if profile&Draft11 != 0 {
			checkList(t, h, "Ratelimit-Policy", m.names, func(q Quota) []sfParam {
				rate := q.Rate
				if rate == 0 {
					rate = q.Limit
				}
				pq, pw := PolicyQuota(rate, q.Window)
				return []sfParam{{"q", pq}, {"w", pw}}
			}, m.last)
			checkList(t, h, "Ratelimit", m.names, func(q Quota) []sfParam {
				return []sfParam{{"r", clampInt(q.Remaining)}, {"t", Seconds(q.Reset)}}
			}, m.last)
		} else if h["Ratelimit"] != nil || h["Ratelimit-Policy"] != nil {
			t.Errorf("profile %v: got RateLimit fields %q", profile, fields(h))
		}
		checkTrio(t, h, &draft03Keys, profile&Draft03 != 0, m.tightest(false))
		epochMode := profile&XRateLimitEpoch != 0
		checkTrio(t, h, &xKeys, profile&(XRateLimitEpoch|XRateLimitDelta) != 0, m.tightest(epochMode))

		// Retry-After: at least 1 and d, and never earlier than a reset of
		// an exhausted quota as written in any set.
		d := time.Duration(retry)
		writeRetryAfter(h, d, now)
		got, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
		if err != nil || len(h["Retry-After"]) != 1 {
			t.Fatalf("Retry-After: got %q, want one integer", h["Retry-After"])
		}
		want := max(1, Seconds(d))
		exact := true // whether want is exactly what Retry-After must be
		if profile&Draft11 != 0 {
			for _, q := range m.last {
				if clampInt(q.Remaining) == 0 {
					want = max(want, Seconds(q.Reset))
				}
			}
		}
		for _, q := range quotas {
			if clampInt(q.Remaining) != 0 {
				continue
			}
			if profile&Draft03 != 0 {
				want = max(want, Seconds(q.Reset))
			}
			switch {
			case profile&XRateLimitEpoch != 0:
				// Read back from a Unix time, rounded up: at least the delay,
				// unless the time was capped or taken for a delay.
				if e := m.epoch(q); e >= epochThreshold && e < sfIntegerMax {
					want = max(want, Seconds(q.Reset))
				}
				exact = false
			case profile&XRateLimitDelta != 0:
				// Delays of 31 years or more are taken for Unix times.
				if Seconds(q.Reset) < epochThreshold {
					want = max(want, Seconds(q.Reset))
				} else {
					exact = false
				}
			}
		}
		if got < want || exact && got != want {
			t.Errorf("Retry-After: got %d, want %d (exact: %v); header %q", got, want, exact, fields(h))
		}
	})
}

// model is what Write should have written, computed independently.
type model struct {
	now    time.Time
	names  []string         // sanitised names in the order first written
	last   map[string]Quota // the last quota written under each name
	quotas []Quota
}

func newModel(p Profile, now time.Time, quotas []Quota) *model {
	m := &model{now: now, last: map[string]Quota{}, quotas: quotas}
	for _, q := range quotas {
		name := make([]byte, len(q.Name))
		for i := range name {
			name[i] = q.Name[i]
			if name[i] < 0x20 || name[i] > 0x7e {
				name[i] = '?'
			}
		}
		if _, ok := m.last[string(name)]; !ok {
			m.names = append(m.names, string(name))
		}
		m.last[string(name)] = q
	}
	return m
}

// epoch returns the X-RateLimit-Reset Unix time for q: now+Reset rounded up.
func (m *model) epoch(q Quota) int64 {
	end := m.now.Add(max(q.Reset, 0))
	e := end.Unix()
	if end.Nanosecond() > 0 {
		e++
	}
	return min(max(e, 0), sfIntegerMax)
}

// tightest returns the Limit, Remaining and Reset the single-value fields
// should hold.
func (m *model) tightest(epochMode bool) [3]string {
	type state struct{ limit, remaining, reset int64 }
	var best state
	for i, q := range m.quotas {
		s := state{clampInt(q.Limit), clampInt(q.Remaining), Seconds(q.Reset)}
		if epochMode {
			s.reset = m.epoch(q)
		}
		if i == 0 || s.remaining < best.remaining ||
			s.remaining == best.remaining && (s.reset > best.reset || s.reset == best.reset && s.limit < best.limit) {
			best = s
		}
	}
	return [3]string{
		strconv.FormatInt(best.limit, 10),
		strconv.FormatInt(best.remaining, 10),
		strconv.FormatInt(best.reset, 10),
	}
}

func checkList(t *testing.T, h http.Header, key string, names []string, params func(Quota) []sfParam, last map[string]Quota) {
	t.Helper()
	lines := h[key]
	if len(lines) != 1 {
		t.Fatalf("%s: got %d field lines %q, want 1", key, len(lines), lines)
	}
	list, err := parseListTree(lines[0])
	if err != nil {
		t.Fatalf("%s: %q does not parse: %v", key, lines[0], err)
	}
	var got []string
	for _, it := range list {
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%s: %q: item %#v is not a String", key, lines[0], it.Value)
		}
		got = append(got, name)
		want := params(last[name])
		if !slices.Equal(it.Params, want) {
			t.Errorf("%s: %q: item %q has parameters %v, want %v", key, lines[0], name, it.Params, want)
		}
		for _, p := range it.Params {
			if v, ok := p.Value.(int64); !ok || v < 0 {
				t.Errorf("%s: %q: parameter %s=%v is not a non-negative Integer", key, lines[0], p.Key, p.Value)
			}
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("%s: %q: got names %q, want %q (unique, in the order first written)", key, lines[0], got, names)
	}
}

func checkTrio(t *testing.T, h http.Header, keys *trioKeys, written bool, want [3]string) {
	t.Helper()
	got := [3]string{h.Get(keys.limit), h.Get(keys.remaining), h.Get(keys.reset)}
	if !written {
		want = [3]string{}
	}
	if got != want {
		t.Errorf("%s, %s, %s: got %q, want %q", keys.limit, keys.remaining, keys.reset, got, want)
	}
}

// FuzzMerge writes a quota into a header whose RateLimit fields other code
// wrote (anything at all): what Write leaves there always parses, holds
// one item of the quota's name, and keeps every other member of a List it
// kept; Retry-After is at least 1.
func FuzzMerge(f *testing.F) {
	f.Add(`"other";r=5;t=1;pk=:AQ==:, tok;r=1, (1 2);x`, `"a";q=1;w=1`, "api")
	f.Add(`"api";r=0;t=9, "b";r=2`, "", "api")
	f.Add(`"a, `, `,`, "a")
	f.Add(`"a";x=(1 2)`, `"a";q=1;x=()`, "b") // an inner list is no parameter value
	f.Fuzz(func(t *testing.T, rl, policy, name string) {
		h := http.Header{}
		if rl != "" {
			h[keyRateLimit] = []string{rl}
		}
		if policy != "" {
			h[keyPolicy] = []string{policy}
		}
		q := Quota{Name: name, Limit: 10, Rate: 5, Window: time.Second, Remaining: 0, Reset: time.Second}
		Write(h, Draft11, q, time.Now())
		WriteRetryAfter(h, time.Second)
		for _, key := range []string{keyRateLimit, keyPolicy} {
			v := h[key]
			if len(v) != 1 {
				t.Fatalf("%s: %d lines, want 1", key, len(v))
			}
			l := scanList(v[0])
			var m member
			mine := 0
			for l.next(&m) {
				if m.value.isString(name) {
					mine++
				}
			}
			if l.err != nil {
				t.Fatalf("%s: %q does not parse: %v", key, v[0], l.err)
			}
			if mine != 1 {
				t.Errorf("%s: %q holds %d items named %q, want 1", key, v[0], mine, name)
			}
		}
		if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s < 1 {
			t.Errorf("Retry-After %q", h.Get("Retry-After"))
		}
	})
}
