package middleware

import "testing"

// A default name's site hash that another limiter of the process has (a
// 2^-32 chance per pair, met by about 400,000 limiters made at one place)
// gets a suffix, never the same buckets.
func TestSiteNamesAreUnique(t *testing.T) {
	issued.Store("0badcafe", true)
	for _, want := range []string{"0badcafe.1", "0badcafe.2"} {
		if got := unique("0badcafe"); got != want {
			t.Errorf("unique(%q) = %q; want %q", "0badcafe", got, want)
		}
	}
	if got := unique("0badf00d"); got != "0badf00d" {
		t.Errorf("unique(%q) = %q; want it unchanged", "0badf00d", got)
	}
	seen := map[string]bool{}
	for range 1000 {
		n := site()
		if seen[n] {
			t.Fatalf("site() gave %q twice", n)
		}
		seen[n] = true
	}
}
