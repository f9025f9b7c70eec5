package headers

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Profile selects which header sets [Write] writes; flags combine, as in
// Draft11|XRateLimitEpoch. The zero Profile writes nothing.
type Profile uint8

const (
	// Draft11 writes RateLimit-Policy and RateLimit, the List fields of draft-11.
	Draft11 Profile = 1 << iota
	// Draft03 writes RateLimit-Limit, -Remaining and -Reset of draft-03 (reset in delay-seconds).
	Draft03
	// XRateLimitEpoch writes X-RateLimit-Limit, -Remaining and -Reset (reset as a Unix time, GitHub style).
	XRateLimitEpoch
	// XRateLimitDelta writes X-RateLimit-Limit, -Remaining and -Reset (reset in delay-seconds).
	XRateLimitDelta
)

// Default is the profile tollgate writes unless told otherwise.
const Default = Draft11 | Draft03

const allProfiles = Draft11 | Draft03 | XRateLimitEpoch | XRateLimitDelta

// ErrInvalidProfile is wrapped by the error [Profile.Validate] returns.
var ErrInvalidProfile = errors.New("invalid profile")

// Validate returns an error wrapping [ErrInvalidProfile] if p sets undefined bits or both
// XRateLimitEpoch and XRateLimitDelta. The zero Profile is valid.
func (p Profile) Validate() error {
	if unknown := p &^ allProfiles; unknown != 0 {
		return fmt.Errorf("headers: %w %v: unknown bits %#02x", ErrInvalidProfile, p, uint8(unknown))
	}
	if p&XRateLimitEpoch != 0 && p&XRateLimitDelta != 0 {
		return fmt.Errorf("headers: %w %v: XRateLimitEpoch and XRateLimitDelta write the same fields; choose one", ErrInvalidProfile, p)
	}
	return nil
}

// String returns the flags of p joined by "|", undefined bits in hexadecimal, or "none".
func (p Profile) String() string {
	var parts []string
	for i, name := range [...]string{"Draft11", "Draft03", "XRateLimitEpoch", "XRateLimitDelta"} {
		if p&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if unknown := p &^ allProfiles; unknown != 0 {
		parts = append(parts, fmt.Sprintf("%#02x", uint8(unknown)))
	}
	return cmp.Or(strings.Join(parts, "|"), "none")
}

// Quota is one limiter's state, to be reported on one response.
// The zero Quota is an unnamed policy with nothing left and nothing to wait for.
type Quota struct {
	Name      string        // policy name; written as an RFC 9651 sf-string
	Limit     int           // the bucket capacity (Burst): the single-value fields' limit
	Rate      int           // tokens per Window: q/w of RateLimit-Policy (0: Limit)
	Window    time.Duration // the limit's Period
	Remaining int           // r: whole tokens left
	Reset     time.Duration // t: time until the next token; 0 when the bucket is full
}

const (
	// Header keys as [http.CanonicalHeaderKey] spells them, to index the map.
	keyPolicy     = "Ratelimit-Policy"
	keyRateLimit  = "Ratelimit"
	keyRetryAfter = "Retry-After"

	sfIntegerMax   = 999_999_999_999_999 // the largest RFC 9651 Integer
	epochThreshold = 1_000_000_000       // an X-RateLimit-Reset this large is a Unix time (2001), not a delay
)

// trio is the state one set of single-value fields reports, and trioKeys their keys.
type trio struct{ limit, remaining, reset int64 }
type trioKeys struct{ limit, remaining, reset string }

var (
	draft03Keys = trioKeys{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset"}
	xKeys       = trioKeys{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}
)

// Write adds q to h (not nil, nor written concurrently) under p, ignoring undefined
// bits; now is used only for XRateLimitEpoch, which wins over XRateLimitDelta. In the
// List fields q's item replaces the first of its name (dropping later ones) or is
// appended, and a List not all of items as rate limiters write them is replaced, so that
// what Write leaves parses; the single-value fields are set to q if what h holds does
// not parse or q is tighter: fewer remaining, then a later reset, then a smaller limit.
func Write(h http.Header, p Profile, q Quota, now time.Time) {
	if p&Draft11 != 0 {
		h.Set(keyPolicy, merge(h[keyPolicy], &q, true))
		h.Set(keyRateLimit, merge(h[keyRateLimit], &q, false))
	}
	t := trio{clampInt(q.Limit), clampInt(q.Remaining), Seconds(q.Reset)}
	if p&Draft03 != 0 {
		t.write(h, &draft03Keys)
	}
	if p&XRateLimitEpoch != 0 {
		t.reset = epochSeconds(now, q.Reset)
	}
	if p&(XRateLimitEpoch|XRateLimitDelta) != 0 {
		t.write(h, &xKeys)
	}
}

// Present reports whether h holds any field that [Write] writes, under any profile.
func Present(h http.Header) bool {
	return len(h[keyPolicy]) != 0 || len(h[keyRateLimit]) != 0 || draft03Keys.present(h) || xKeys.present(h)
}

func (k *trioKeys) present(h http.Header) bool {
	return len(h[k.limit]) != 0 || len(h[k.remaining]) != 0 || len(h[k.reset]) != 0
}

// WriteRetryAfter sets Retry-After for a 429 (or 503), replacing any value: d in whole
// seconds ([Seconds]), at least 1, and no earlier than the reset of each exhausted quota
// in h: r=0 in a RateLimit List that parses, or a Remaining of 0 in a single-value set
// (where an X-RateLimit-Reset of 10⁹ or more is a Unix time, read with [time.Now]).
func WriteRetryAfter(h http.Header, d time.Duration) {
	writeRetryAfter(h, d, time.Now())
}

func writeRetryAfter(h http.Header, d time.Duration, now time.Time) {
	secs := max(Seconds(d), 1)
	for _, m := range list(h[keyRateLimit]) {
		r, t := int64(-1), int64(0)
		for _, p := range split(m, ';')[1:] {
			k, v, _ := strings.Cut(strings.TrimLeft(p, " "), "=")
			if n, ok := readInt([]string{v}); ok && k == "r" {
				r = n
			} else if ok && k == "t" {
				t = n
			}
		}
		if r == 0 {
			secs = max(secs, t)
		}
	}
	for _, keys := range [...]*trioKeys{&draft03Keys, &xKeys} {
		if t, ok := readTrio(h, keys); ok && t.remaining == 0 {
			if keys == &xKeys && t.reset >= epochThreshold {
				t.reset = Seconds(time.Unix(t.reset, 0).Sub(now))
			}
			secs = max(secs, t.reset)
		}
	}
	h[keyRetryAfter] = []string{strconv.FormatInt(secs, 10)}
}

// Seconds rounds d up to whole seconds (negative and zero give 0).
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}

// PolicyQuota returns the q and w of RateLimit-Policy for rate tokens per period: w is
// period in seconds ([Seconds]), at least 1, and q the tokens in w rounded down, so that
// q/w never exceeds the rate (5 per 500ms is q=10;w=1). A period of 0 or less gives q=rate;w=1.
func PolicyQuota(rate int, period time.Duration) (q, w int64) {
	q, w = clampInt(rate), max(Seconds(period), 1)
	if period <= 0 {
		return q, w
	}
	// q*w seconds/period in 128 bits; a quotient of 64 bits or more is capped.
	hi, lo := bits.Mul64(uint64(q), uint64(w)*uint64(time.Second))
	if hi >= uint64(period) {
		return sfIntegerMax, w
	}
	n, _ := bits.Div64(hi, lo, uint64(period))
	return int64(min(n, sfIntegerMax)), w
}

// epochSeconds returns the Unix time d after now, rounded up, within [0, sfIntegerMax].
func epochSeconds(now time.Time, d time.Duration) int64 {
	d = max(d, 0)
	s := int64(d/time.Second) + Seconds(d%time.Second+time.Duration(now.Nanosecond()))
	unix := min(max(now.Unix(), -sfIntegerMax), sfIntegerMax) // so that unix+s cannot overflow
	return min(max(unix+s, 0), sfIntegerMax)
}

// clampInt returns v within [0, sfIntegerMax], an RFC 9651 Integer.
func clampInt(v int) int64 {
	return min(max(int64(v), 0), sfIntegerMax)
}

// merge returns lines with q's item (policy: RateLimit-Policy's) in, as [Write] says.
func merge(lines []string, q *Quota, policy bool) string {
	var buf [64]byte // BenchmarkWrite, Default/one quota: 6 allocations fewer
	if len(lines) == 0 {
		return string(appendItem(buf[:0], q, policy))
	}
	name := string(appendString(buf[:0], q.Name))
	b, mine := []byte(nil), false
	for _, m := range list(lines) {
		switch {
		case !strings.HasPrefix(m, name) || len(m) > len(name) && m[len(name)] != ';':
			b = append(append(b, m...), ", "...)
		case !mine:
			b, mine = append(appendItem(b, q, policy), ", "...), true
		}
	}
	if mine {
		return string(b[:len(b)-2])
	}
	return string(appendItem(b, q, policy))
}

// list returns the trimmed members of the List field lines, or nil unless each is as
// [Write] keeps it: an item or inner list of items, with parameters whose values are items.
func list(lines []string) []string {
	ms := split(strings.Join(lines, ","), ',')
	for i, m := range ms {
		if ms[i] = strings.Trim(m, " \t"); !plainMember(ms[i]) {
			return nil
		}
	}
	return ms
}

// plainMember is not inlined into list: in a loop there, split would allocate.
func plainMember(m string) bool {
	parts := split(m, ';')
	for _, p := range parts[1:] {
		k, v, hasValue := strings.Cut(strings.TrimLeft(p, " "), "=") // spaces only after ';'
		isKey := k != "" && (k[0] == '*' || k[0] >= 'a' && k[0] <= 'z') && strings.Trim(k, lcalpha+digits+"_-.*") == ""
		if !isKey || hasValue && (!plainItem(v) || v[0] == '(') {
			return false
		}
	}
	return plainItem(parts[0])
}

const (
	lcalpha = "abcdefghijklmnopqrstuvwxyz"
	alpha   = "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + lcalpha
	digits  = "0123456789"
)

// plainItem reports whether s is a bare item but a Date or Display String, or an inner list of those.
func plainItem(s string) bool {
	if s == "" {
		return false
	}
	switch c := s[0]; {
	case c == '"': // printable ASCII, '"' and '\' escaped, up to the closing '"'
		for i := 1; i < len(s); i++ {
			if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
				i++
			} else if s[i] == '"' || s[i] < ' ' || s[i] > '~' || s[i] == '\\' {
				return s[i] == '"' && i == len(s)-1
			}
		}
		return false
	case c == '?':
		return s == "?0" || s == "?1"
	case c == ':':
		b64, ok := strings.CutSuffix(s[1:], ":")
		_, err := base64.StdEncoding.DecodeString(b64) // which skips '\r' and '\n': so the Trim
		return ok && err == nil && strings.Trim(b64, alpha+digits+"+/=") == ""
	case c == '(':
		inner, ok := strings.CutSuffix(s[1:], ")")
		for _, it := range strings.Split(inner, " ") {
			ok = ok && (it == "" || it[0] != '(' && plainItem(it))
		}
		return ok
	case c == '-' || c >= '0' && c <= '9':
		whole, frac, dec := strings.Cut(strings.TrimPrefix(s, "-"), ".")
		return isDigits(whole, 15) && (!dec || len(whole) <= 12 && isDigits(frac, 3))
	case c == '*' || c|0x20 >= 'a' && c|0x20 <= 'z': // a Token
		return strings.Trim(s, alpha+digits+"!#$%&'*+-.^_`|~:/") == ""
	}
	return false
}

func isDigits(s string, n int) bool {
	return len(s) >= 1 && len(s) <= n && strings.Trim(s, digits) == ""
}

// split cuts s at each sep outside RFC 9651 Strings.
func split(s string, sep byte) (out []string) {
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// appendItem appends q's RateLimit-Policy item (if policy) or RateLimit item.
func appendItem(b []byte, q *Quota, policy bool) []byte {
	b = appendString(b, q.Name)
	if !policy {
		b = strconv.AppendInt(append(b, ";r="...), clampInt(q.Remaining), 10)
		return strconv.AppendInt(append(b, ";t="...), Seconds(q.Reset), 10)
	}
	quota, window := PolicyQuota(cmp.Or(q.Rate, q.Limit), q.Window)
	b = strconv.AppendInt(append(b, ";q="...), quota, 10)
	return strconv.AppendInt(append(b, ";w="...), window, 10)
}

// appendString appends s as an RFC 9651 String, each byte it cannot hold as '?'.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// tighter is the order of [Write]; a strict one, so that Writes commute.
func (t trio) tighter(u trio) bool {
	return cmp.Or(cmp.Compare(u.remaining, t.remaining), cmp.Compare(t.reset, u.reset), cmp.Compare(u.limit, t.limit)) > 0
}

// write sets the fields keys of h to t, unless they hold a state that parses and is as tight.
func (t trio) write(h http.Header, keys *trioKeys) {
	if old, ok := readTrio(h, keys); !ok || t.tighter(old) {
		h.Set(keys.limit, strconv.FormatInt(t.limit, 10))
		h.Set(keys.remaining, strconv.FormatInt(t.remaining, 10))
		h.Set(keys.reset, strconv.FormatInt(t.reset, 10))
	}
}

// readTrio reads the fields keys from h, if each is one line of 1 to 18 digits.
func readTrio(h http.Header, keys *trioKeys) (trio, bool) {
	limit, ok1 := readInt(h[keys.limit])
	remaining, ok2 := readInt(h[keys.remaining])
	reset, ok3 := readInt(h[keys.reset])
	return trio{limit, remaining, reset}, ok1 && ok2 && ok3
}

func readInt(lines []string) (n int64, ok bool) {
	if ok = len(lines) == 1 && isDigits(lines[0], 18); ok {
		n, _ = strconv.ParseInt(lines[0], 10, 64)
	}
	return n, ok
}
