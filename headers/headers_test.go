package headers

import (
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// epoch is a fixed instant on a whole second.
var epoch = time.Unix(1_700_000_000, 0)

// writeAll writes each quota to a new header and returns it.
func writeAll(p Profile, now time.Time, qs ...Quota) http.Header {
	h := make(http.Header)
	for _, q := range qs {
		Write(h, p, q, now)
	}
	return h
}

// fields returns the header as one string per field, "Key: v1 | v2", sorted.
func fields(h http.Header) []string {
	var out []string
	for k, vs := range h {
		out = append(out, k+": "+strings.Join(vs, " | "))
	}
	slices.Sort(out)
	return out
}

func TestWriteDraft11(t *testing.T) {
	api := Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 42, Reset: 1500 * time.Millisecond}
	tests := []struct {
		name       string
		quotas     []Quota
		wantPolicy string
		wantLimit  string
	}{
		{
			name:       "one quota",
			quotas:     []Quota{api},
			wantPolicy: `"api";q=100;w=60`,
			wantLimit:  `"api";r=42;t=2`,
		},
		{
			name: "two quotas in the order written",
			quotas: []Quota{
				{Name: "burst", Limit: 10, Window: time.Second, Remaining: 3, Reset: 100 * time.Millisecond},
				{Name: "daily", Limit: 1000, Window: 24 * time.Hour, Remaining: 900, Reset: 86 * time.Second},
			},
			wantPolicy: `"burst";q=10;w=1, "daily";q=1000;w=86400`,
			wantLimit:  `"burst";r=3;t=1, "daily";r=900;t=86`,
		},
		{
			name: "same name replaced in place",
			quotas: []Quota{
				{Name: "a", Limit: 1, Window: time.Second, Remaining: 1},
				{Name: "b", Limit: 2, Window: time.Second, Remaining: 2},
				{Name: "a", Limit: 3, Window: 3 * time.Second, Remaining: 0, Reset: time.Second},
			},
			wantPolicy: `"a";q=3;w=3, "b";q=2;w=1`,
			wantLimit:  `"a";r=0;t=1, "b";r=2;t=0`,
		},
		{
			name:       "quote and backslash escaped",
			quotas:     []Quota{{Name: `a"b\c`, Limit: 1, Window: time.Second, Remaining: 1}},
			wantPolicy: `"a\"b\\c";q=1;w=1`,
			wantLimit:  `"a\"b\\c";r=1;t=0`,
		},
		{
			name: "escaped name replaced",
			quotas: []Quota{
				{Name: `a"b\c`, Limit: 1, Window: time.Second, Remaining: 1},
				{Name: `a"b\c`, Limit: 2, Window: time.Second, Remaining: 2},
			},
			wantPolicy: `"a\"b\\c";q=2;w=1`,
			wantLimit:  `"a\"b\\c";r=2;t=0`,
		},
		{
			name:       "non-ASCII bytes become ?",
			quotas:     []Quota{{Name: "café", Limit: 1, Window: time.Second, Remaining: 1}},
			wantPolicy: `"caf??";q=1;w=1`,
			wantLimit:  `"caf??";r=1;t=0`,
		},
		{
			name:       "control characters and DEL become ?",
			quotas:     []Quota{{Name: "a\x00b\tc\nd\x7f", Limit: 1, Window: time.Second}},
			wantPolicy: `"a?b?c?d?";q=1;w=1`,
			wantLimit:  `"a?b?c?d?";r=0;t=0`,
		},
		{
			name: "names equal once sanitised are one policy",
			quotas: []Quota{
				{Name: "é", Limit: 1, Window: time.Second, Remaining: 1},
				{Name: "??", Limit: 2, Window: time.Second, Remaining: 2},
			},
			wantPolicy: `"??";q=2;w=1`,
			wantLimit:  `"??";r=2;t=0`,
		},
		{
			name:       "empty name",
			quotas:     []Quota{{}},
			wantPolicy: `"";q=0;w=1`,
			wantLimit:  `"";r=0;t=0`,
		},
		{
			name:       "negative values written as 0, window at least 1",
			quotas:     []Quota{{Name: "n", Limit: -1, Window: -time.Second, Remaining: -5, Reset: -time.Second}},
			wantPolicy: `"n";q=0;w=1`,
			wantLimit:  `"n";r=0;t=0`,
		},
		{
			name:       "zero window is 1",
			quotas:     []Quota{{Name: "z", Limit: 5, Remaining: 5}},
			wantPolicy: `"z";q=5;w=1`,
			wantLimit:  `"z";r=5;t=0`,
		},
		{
			name:       "1 per ns is 10^9 per second",
			quotas:     []Quota{{Name: "r", Limit: 1, Window: 1, Reset: 1}},
			wantPolicy: `"r";q=1000000000;w=1`,
			wantLimit:  `"r";r=0;t=1`,
		},
		{
			name:       "1s is 1",
			quotas:     []Quota{{Name: "r", Limit: 1, Window: time.Second, Reset: time.Second}},
			wantPolicy: `"r";q=1;w=1`,
			wantLimit:  `"r";r=0;t=1`,
		},
		{
			name:       "1s+1ns rounds up to 2, the quota down",
			quotas:     []Quota{{Name: "r", Limit: 1, Window: time.Second + 1, Reset: time.Second + 1}},
			wantPolicy: `"r";q=1;w=2`,
			wantLimit:  `"r";r=0;t=2`,
		},
		{
			name:       "sub-second window is 1, its rate scaled",
			quotas:     []Quota{{Name: "ms", Limit: 10, Window: 100 * time.Millisecond, Remaining: 9, Reset: 10 * time.Millisecond}},
			wantPolicy: `"ms";q=100;w=1`,
			wantLimit:  `"ms";r=9;t=1`,
		},
		{
			name:       "largest values capped to RFC 9651 Integers",
			quotas:     []Quota{{Name: "big", Limit: math.MaxInt, Window: math.MaxInt64, Remaining: math.MaxInt, Reset: math.MaxInt64}},
			wantPolicy: `"big";q=999999999999999;w=9223372037`,
			wantLimit:  `"big";r=999999999999999;t=9223372037`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := writeAll(Draft11, epoch, tt.quotas...)
			if got := h["Ratelimit-Policy"]; !slices.Equal(got, []string{tt.wantPolicy}) {
				t.Errorf("RateLimit-Policy: got %q, want %q", got, tt.wantPolicy)
			}
			if got := h["Ratelimit"]; !slices.Equal(got, []string{tt.wantLimit}) {
				t.Errorf("RateLimit: got %q, want %q", got, tt.wantLimit)
			}
			if len(h) != 2 {
				t.Errorf("got fields %q, want only RateLimit and RateLimit-Policy", fields(h))
			}
		})
	}
}

func TestWriteDraft11MergesWithExisting(t *testing.T) {
	q := Quota{Name: "api", Limit: 10, Window: time.Second, Remaining: 4, Reset: time.Second}
	tests := []struct {
		name     string
		existing []string
		want     string
	}{
		{"empty line", []string{""}, `"api";r=4;t=1`},
		{
			"other items kept as written",
			[]string{`"other";r=5;t=1;pk=:AQ==:,tok;r=1 ,  (1 2);x`},
			`"other";r=5;t=1;pk=:AQ==:, tok;r=1, (1 2);x, "api";r=4;t=1`,
		},
		{
			"same name replaced in place, its parameters dropped",
			[]string{`"a";r=1, "api";r=9;t=9;pk=:AQ==:, "b";r=2`},
			`"a";r=1, "api";r=4;t=1, "b";r=2`,
		},
		{
			"duplicates of the same name dropped",
			[]string{`"api";r=1, "b";r=2, "api";r=3`},
			`"api";r=4;t=1, "b";r=2`,
		},
		{
			"a token of the same name is another item",
			[]string{`api;r=1`},
			`api;r=1, "api";r=4;t=1`,
		},
		{
			"several field lines combined",
			[]string{`"a";r=1`, `"api";r=2, "b";r=3`},
			`"a";r=1, "api";r=4;t=1, "b";r=3`,
		},
		{"a List that does not parse is replaced", []string{`"a";r=1,,`}, `"api";r=4;t=1`},
		{"a string with no end is replaced", []string{`"a`}, `"api";r=4;t=1`},
		{"an inner list as a parameter value is replaced", []string{`"a";x=(1 2)`}, `"api";r=4;t=1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Ratelimit": slices.Clone(tt.existing)}
			Write(h, Draft11, q, epoch)
			if got := h["Ratelimit"]; !slices.Equal(got, []string{tt.want}) {
				t.Errorf("RateLimit: got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestWriteTightest(t *testing.T) {
	tests := []struct {
		name   string
		a, b   Quota
		want03 [3]string // Limit, Remaining, Reset
	}{
		{
			name:   "fewer remaining wins",
			a:      Quota{Name: "a", Limit: 100, Remaining: 50, Reset: 10 * time.Second},
			b:      Quota{Name: "b", Limit: 10, Remaining: 5, Reset: time.Second},
			want03: [3]string{"10", "5", "1"},
		},
		{
			name:   "fewer remaining wins over a later reset",
			a:      Quota{Name: "a", Limit: 100, Remaining: 1, Reset: time.Second},
			b:      Quota{Name: "b", Limit: 1000, Remaining: 2, Reset: time.Hour},
			want03: [3]string{"100", "1", "1"},
		},
		{
			name:   "tie on remaining: the later reset wins",
			a:      Quota{Name: "a", Limit: 10, Remaining: 0, Reset: 2 * time.Second},
			b:      Quota{Name: "b", Limit: 1000, Remaining: 0, Reset: 30 * time.Second},
			want03: [3]string{"1000", "0", "30"},
		},
		{
			name:   "tie on remaining and reset: the smaller limit wins",
			a:      Quota{Name: "a", Limit: 10, Remaining: 3, Reset: time.Second},
			b:      Quota{Name: "b", Limit: 7, Remaining: 3, Reset: time.Second},
			want03: [3]string{"7", "3", "1"},
		},
		{
			name:   "resets compared after rounding",
			a:      Quota{Name: "a", Limit: 10, Remaining: 3, Reset: 1100 * time.Millisecond},
			b:      Quota{Name: "b", Limit: 7, Remaining: 3, Reset: 1900 * time.Millisecond},
			want03: [3]string{"7", "3", "2"},
		},
		{
			name:   "negative remaining is 0",
			a:      Quota{Name: "a", Limit: 10, Remaining: -3, Reset: time.Second},
			b:      Quota{Name: "b", Limit: 7, Remaining: 0, Reset: time.Second},
			want03: [3]string{"7", "0", "1"},
		},
		{
			name:   "identical",
			a:      Quota{Name: "a", Limit: 7, Remaining: 3, Reset: time.Second},
			b:      Quota{Name: "b", Limit: 7, Remaining: 3, Reset: time.Second},
			want03: [3]string{"7", "3", "1"},
		},
	}
	for _, tt := range tests {
		for _, order := range [][2]Quota{{tt.a, tt.b}, {tt.b, tt.a}} {
			t.Run(tt.name+"/"+order[0].Name+" first", func(t *testing.T) {
				for _, p := range []Profile{Draft03, XRateLimitDelta} {
					keys := draft03Keys
					if p == XRateLimitDelta {
						keys = xKeys
					}
					h := writeAll(p, epoch, order[0], order[1])
					got := [3]string{h.Get(keys.limit), h.Get(keys.remaining), h.Get(keys.reset)}
					if got != tt.want03 {
						t.Errorf("%v: got Limit, Remaining, Reset %q, want %q", p, got, tt.want03)
					}
				}
			})
		}
	}
}

func TestWriteTightestEpoch(t *testing.T) {
	now := epoch.Add(400 * time.Millisecond)
	a := Quota{Name: "a", Limit: 10, Remaining: 0, Reset: 10 * time.Second}
	b := Quota{Name: "b", Limit: 100, Remaining: 0, Reset: 20 * time.Second}
	for _, qs := range [][]Quota{{a, b}, {b, a}} {
		h := writeAll(XRateLimitEpoch, now, qs...)
		got := [3]string{h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset")}
		want := [3]string{"100", "0", "1700000021"} // 1700000000.4 + 20 s, rounded up
		if got != want {
			t.Errorf("%s first: got %q, want %q", qs[0].Name, got, want)
		}
	}
}

func TestWriteEpochReset(t *testing.T) {
	tests := []struct {
		name  string
		now   time.Time
		reset time.Duration
		want  string
	}{
		{"whole second, whole delay", epoch, 2 * time.Second, "1700000002"},
		{"whole second, delay rounded up", epoch, 1500 * time.Millisecond, "1700000002"},
		{"fraction plus delay within the second", epoch.Add(600 * time.Millisecond), 300 * time.Millisecond, "1700000001"},
		{"fraction plus delay past the second", epoch.Add(600 * time.Millisecond), 500 * time.Millisecond, "1700000002"},
		{"fraction plus delay ending on a second", epoch.Add(500 * time.Millisecond), 500 * time.Millisecond, "1700000001"},
		{"full bucket on a whole second", epoch, 0, "1700000000"},
		{"full bucket mid-second", epoch.Add(time.Nanosecond), 0, "1700000001"},
		{"negative delay is now", epoch, -time.Hour, "1700000000"},
		{"before 1970 is 0", time.Unix(-100, 0), time.Second, "0"},
		{"from before 1970 to after", time.Unix(-1, 0), 3 * time.Second, "2"},
		{"far future capped", time.Unix(1<<62, 0), time.Second, "999999999999999"},
		{"largest delay", epoch, math.MaxInt64, "10923372037"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := writeAll(XRateLimitEpoch, tt.now, Quota{Name: "e", Limit: 1, Reset: tt.reset})
			if got := h.Get("X-RateLimit-Reset"); got != tt.want {
				t.Errorf("X-RateLimit-Reset: got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestWriteSingleValueOverwritesWhatDoesNotParse(t *testing.T) {
	q := Quota{Name: "q", Limit: 10, Remaining: 5, Reset: 2 * time.Second}
	tests := []struct {
		name     string
		existing http.Header
	}{
		{"not a number", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {"abc"}, "Ratelimit-Reset": {"1"}}},
		{"negative", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {"-1"}, "Ratelimit-Reset": {"1"}}},
		{"plus sign", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {"+1"}, "Ratelimit-Reset": {"1"}}},
		{"empty", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {""}, "Ratelimit-Reset": {"1"}}},
		{"two lines", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {"0", "0"}, "Ratelimit-Reset": {"1"}}},
		{"reset missing", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {"0"}}},
		{"limit missing", http.Header{"Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"9"}}},
		{"too many digits", http.Header{"Ratelimit-Limit": {"1"}, "Ratelimit-Remaining": {"0000000000000000000"}, "Ratelimit-Reset": {"1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.existing
			Write(h, Draft03, q, epoch)
			got := [3]string{h.Get("RateLimit-Limit"), h.Get("RateLimit-Remaining"), h.Get("RateLimit-Reset")}
			if want := [3]string{"10", "5", "2"}; got != want {
				t.Errorf("got %q, want %q", got, want)
			}
		})
	}

	t.Run("tighter values that parse are kept", func(t *testing.T) {
		h := http.Header{"Ratelimit-Limit": {"3"}, "Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"9"}}
		Write(h, Draft03, q, epoch)
		got := [3]string{h.Get("RateLimit-Limit"), h.Get("RateLimit-Remaining"), h.Get("RateLimit-Reset")}
		if want := [3]string{"3", "0", "9"}; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
}

func TestWriteProfiles(t *testing.T) {
	q := Quota{Name: "api", Limit: 100, Window: time.Minute, Remaining: 42, Reset: 1500 * time.Millisecond}
	now := epoch
	draft11 := []string{`Ratelimit-Policy: "api";q=100;w=60`, `Ratelimit: "api";r=42;t=2`}
	draft03 := []string{"Ratelimit-Limit: 100", "Ratelimit-Remaining: 42", "Ratelimit-Reset: 2"}
	xEpoch := []string{"X-Ratelimit-Limit: 100", "X-Ratelimit-Remaining: 42", "X-Ratelimit-Reset: 1700000002"}
	xDelta := []string{"X-Ratelimit-Limit: 100", "X-Ratelimit-Remaining: 42", "X-Ratelimit-Reset: 2"}
	cat := func(sets ...[]string) []string {
		out := slices.Concat(sets...)
		slices.Sort(out)
		return out
	}
	tests := []struct {
		p    Profile
		want []string
	}{
		{0, nil},
		{Draft11, cat(draft11)},
		{Draft03, cat(draft03)},
		{XRateLimitEpoch, cat(xEpoch)},
		{XRateLimitDelta, cat(xDelta)},
		{Default, cat(draft11, draft03)},
		{Draft11 | XRateLimitEpoch, cat(draft11, xEpoch)},
		{Draft03 | XRateLimitDelta, cat(draft03, xDelta)},
		{Default | XRateLimitEpoch, cat(draft11, draft03, xEpoch)},
		{Default | XRateLimitDelta, cat(draft11, draft03, xDelta)},
		{XRateLimitEpoch | XRateLimitDelta, cat(xEpoch)}, // invalid: epoch wins
		{0x80 | Draft03, cat(draft03)},                   // invalid: unknown bits ignored
	}
	for _, tt := range tests {
		t.Run(tt.p.String(), func(t *testing.T) {
			h := writeAll(tt.p, now, q)
			if got := fields(h); !slices.Equal(got, tt.want) {
				t.Errorf("got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestWriteKeysAreCanonical(t *testing.T) {
	for _, k := range []string{keyPolicy, keyRateLimit, keyRetryAfter,
		draft03Keys.limit, draft03Keys.remaining, draft03Keys.reset,
		xKeys.limit, xKeys.remaining, xKeys.reset} {
		if got := http.CanonicalHeaderKey(k); got != k {
			t.Errorf("key %q: canonical form is %q", k, got)
		}
	}
	h := writeAll(Default|XRateLimitDelta, epoch, Quota{Name: "a", Limit: 1})
	for _, name := range []string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining",
		"RateLimit-Reset", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if h.Get(name) == "" {
			t.Errorf("h.Get(%q): got nothing, want a value", name)
		}
	}
}

func TestWriteValuesDoNotShareCapacity(t *testing.T) {
	h := writeAll(Default, epoch, Quota{Name: "a", Limit: 1, Remaining: 1})
	h.Add("Ratelimit-Policy", "extra")
	h.Add("Ratelimit", "extra")
	want := []string{
		`Ratelimit-Limit: 1`,
		`Ratelimit-Policy: "a";q=1;w=1 | extra`,
		`Ratelimit-Remaining: 1`,
		`Ratelimit-Reset: 0`,
		`Ratelimit: "a";r=1;t=0 | extra`,
	}
	if got := fields(h); !slices.Equal(got, want) {
		t.Errorf("after Add:\n got %q\nwant %q", got, want)
	}
}

func TestProfileValidate(t *testing.T) {
	tests := []struct {
		p       Profile
		wantErr string
	}{
		{0, ""},
		{Draft11, ""},
		{Draft03, ""},
		{XRateLimitEpoch, ""},
		{XRateLimitDelta, ""},
		{Default, ""},
		{Default | XRateLimitEpoch, ""},
		{Default | XRateLimitDelta, ""},
		{XRateLimitEpoch | XRateLimitDelta, "headers: invalid profile XRateLimitEpoch|XRateLimitDelta: XRateLimitEpoch and XRateLimitDelta write the same fields; choose one"},
		{Default | XRateLimitEpoch | XRateLimitDelta, "headers: invalid profile Draft11|Draft03|XRateLimitEpoch|XRateLimitDelta: XRateLimitEpoch and XRateLimitDelta write the same fields; choose one"},
		{0x10, "headers: invalid profile 0x10: unknown bits 0x10"},
		{Draft11 | 0xc0, "headers: invalid profile Draft11|0xc0: unknown bits 0xc0"},
	}
	for _, tt := range tests {
		t.Run(tt.p.String(), func(t *testing.T) {
			err := tt.p.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("got %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("got %v, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidProfile) {
				t.Errorf("errors.Is(%v, ErrInvalidProfile): got false, want true", err)
			}
		})
	}
}

func TestProfileString(t *testing.T) {
	tests := []struct {
		p    Profile
		want string
	}{
		{0, "none"},
		{Default, "Draft11|Draft03"},
		{XRateLimitEpoch, "XRateLimitEpoch"},
		{Draft03 | XRateLimitDelta | 0x20, "Draft03|XRateLimitDelta|0x20"},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("Profile(%#x).String(): got %q, want %q", uint8(tt.p), got, tt.want)
		}
	}
}

func TestSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{math.MinInt64, 0},
		{-time.Second, 0},
		{-1, 0},
		{0, 0},
		{1, 1},
		{time.Second - 1, 1},
		{time.Second, 1},
		{time.Second + 1, 2},
		{90 * time.Second, 90},
		{time.Hour + time.Millisecond, 3601},
		{math.MaxInt64, 9223372037},
	}
	for _, tt := range tests {
		if got := Seconds(tt.d); got != tt.want {
			t.Errorf("Seconds(%v): got %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestWriteRetryAfter(t *testing.T) {
	now := epoch.Add(250 * time.Millisecond)
	exhausted := func(p Profile, reset time.Duration) http.Header {
		return writeAll(p, now, Quota{Name: "x", Limit: 10, Remaining: 0, Reset: reset})
	}
	tests := []struct {
		name string
		h    http.Header
		d    time.Duration
		want string
	}{
		{"zero is 1", http.Header{}, 0, "1"},
		{"negative is 1", http.Header{}, -time.Minute, "1"},
		{"1ns is 1", http.Header{}, 1, "1"},
		{"1s is 1", http.Header{}, time.Second, "1"},
		{"1s+1ns is 2", http.Header{}, time.Second + 1, "2"},
		{"replaces an earlier value", http.Header{"Retry-After": {"999", "7"}}, 3 * time.Second, "3"},
		{"exhausted List item wins", exhausted(Draft11, 30*time.Second), 5 * time.Second, "30"},
		{"d wins over a shorter exhausted reset", exhausted(Draft11, 3*time.Second), 5 * time.Second, "5"},
		{
			"the largest t of exhausted items",
			http.Header{"Ratelimit": {`"a";r=0;t=12, "b";r=0;t=40`, `"c";r=0;t=7`}},
			time.Second, "40",
		},
		{
			"items with quota left are not exhausted",
			http.Header{"Ratelimit": {`"a";r=1;t=100, "b";r=0;t=8`}},
			time.Second, "8",
		},
		{"item without t ignored", http.Header{"Ratelimit": {`"a";r=0`}}, time.Second, "1"},
		{"item with decimal t ignored", http.Header{"Ratelimit": {`"a";r=0;t=9.5`}}, time.Second, "1"},
		{"List that does not parse ignored", http.Header{"Ratelimit": {`"a";r=0;t=50,`}}, time.Second, "1"},
		{"exhausted draft-03 fields", exhausted(Draft03, 45*time.Second), time.Second, "45"},
		{
			"draft-03 fields with quota left ignored",
			http.Header{"Ratelimit-Limit": {"5"}, "Ratelimit-Remaining": {"1"}, "Ratelimit-Reset": {"60"}},
			time.Second, "1",
		},
		{"exhausted X-RateLimit delta", exhausted(XRateLimitDelta, 33*time.Second), time.Second, "33"},
		// Written at now: the epoch is 1700000000.25+50s rounded up to
		// 1700000051, which is 50.75 s after now, so 51.
		{"exhausted X-RateLimit epoch", exhausted(XRateLimitEpoch, 50*time.Second), time.Second, "51"},
		{"X-RateLimit epoch in the past", http.Header{"X-Ratelimit-Limit": {"5"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"1600000000"}}, time.Second, "1"},
		{"all sets, the largest wins", writeAll(Default|XRateLimitDelta, now,
			Quota{Name: "a", Limit: 10, Remaining: 0, Reset: 20 * time.Second},
			Quota{Name: "b", Limit: 10, Remaining: 0, Reset: 70 * time.Second},
		), time.Second, "70"},
		// The epoch is rounded up to a whole second when written, so read
		// back it can be up to a second later than t: never earlier.
		{"all sets with epoch, the largest wins", writeAll(Default|XRateLimitEpoch, now,
			Quota{Name: "a", Limit: 10, Remaining: 0, Reset: 20 * time.Second},
			Quota{Name: "b", Limit: 10, Remaining: 0, Reset: 70 * time.Second},
		), time.Second, "71"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			writeRetryAfter(tt.h, tt.d, now)
			if got := tt.h["Retry-After"]; !slices.Equal(got, []string{tt.want}) {
				t.Errorf("Retry-After: got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestWriteRetryAfterUsesTheClock(t *testing.T) {
	h := writeAll(XRateLimitEpoch, time.Now(), Quota{Name: "x", Limit: 10, Remaining: 0, Reset: time.Hour})
	WriteRetryAfter(h, time.Second)
	// Between 3599 and 3601 seconds, whatever the sub-second phase of the clock.
	if got := h.Get("Retry-After"); got != "3600" && got != "3601" && got != "3599" {
		t.Errorf("Retry-After: got %q, want about 3600", got)
	}
}

// TestPolicyQuota checks that RateLimit-Policy states the limit's rate,
// not its burst: q/w is Rate/Period, w whole seconds, q rounded down.
func TestPolicyQuota(t *testing.T) {
	for _, tc := range []struct {
		rate   int
		period time.Duration
		q, w   int64
	}{
		{100, time.Minute, 100, 60}, // Limit{100/min, Burst 10}: not q=10
		{2, time.Second, 2, 1},      // Limit{2/s, Burst 4}: not q=4
		{5, 500 * time.Millisecond, 10, 1},
		{3, 1500 * time.Millisecond, 4, 2},
		{7, 300 * time.Millisecond, 23, 1}, // 23.3 per second, rounded down
		{1, time.Hour, 1, 3600},
		{0, time.Second, 0, 1},
		{5, 0, 5, 1}, // no period: the documented fallback
		{math.MaxInt, time.Nanosecond, sfIntegerMax, 1},
	} {
		q, w := PolicyQuota(tc.rate, tc.period)
		if q != tc.q || w != tc.w {
			t.Errorf("PolicyQuota(%d, %v) = q=%d;w=%d, want q=%d;w=%d", tc.rate, tc.period, q, w, tc.q, tc.w)
		}
	}
	h := http.Header{}
	Write(h, Draft11, Quota{Name: "api", Limit: 10, Rate: 100, Window: time.Minute, Remaining: 10}, time.Now())
	if got := h.Get("RateLimit-Policy"); got != `"api";q=100;w=60` {
		t.Errorf("RateLimit-Policy of 100/min, burst 10: %q, want \"api\";q=100;w=60", got)
	}
}
