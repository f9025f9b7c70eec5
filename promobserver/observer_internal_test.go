package promobserver

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tollgate-go/tollgate/middleware"
)

// The worst case reaches the bound exactly, and the Observer's own maps,
// which hold what the hot path reads, stay within it too: a cache keyed by
// the raw values would grow with the garbage.
func TestWorstCaseBound(t *testing.T) {
	const maxLimiters = 10
	o, err := New(WithMaxLimiters(maxLimiters))
	if err != nil {
		t.Fatal(err)
	}
	classes := []string{"", "bad:class", "other", "none"}
	for i := range 40 { // more valid-looking classes than the 32 allowed
		classes = append(classes, "c"+string(rune('a'+i/26))+string(rune('a'+i%26)))
	}
	for n := range 3 * maxLimiters {
		for _, class := range classes {
			for k := middleware.EventAllowed; k <= middleware.EventSkipped; k++ {
				o.Observe(middleware.Event{Kind: k, Limiter: fmt.Sprint("lim-", n), KeyClass: class, Cost: 1})
			}
		}
	}

	// limiter: 10 names and other; key_class: 32 classes, other and none;
	// outcome: 5 (the breaker events count nothing here).
	const want = (maxLimiters + 1) * (maxKeyClasses + 2) * 5
	if n := testutil.CollectAndCount(o, "tollgate_requests_total"); n != want {
		t.Errorf("requests_total: %d series, want %d", n, want)
	}
	limiters := *o.limiters.Load()
	if len(limiters) != maxLimiters+1 {
		t.Errorf("%d limiters cached, want %d", len(limiters), maxLimiters+1)
	}
	if n := len(*o.classes.Load()); n != maxKeyClasses {
		t.Errorf("%d key classes accepted, want %d", n, maxKeyClasses)
	}
	for name, l := range limiters {
		if n := len(*l.classes.Load()); n != maxKeyClasses+2 {
			t.Errorf("limiter %q: %d key classes cached, want %d", name, n, maxKeyClasses+2)
		}
	}
	t.Logf("worst case with WithMaxLimiters(%d): %d requests_total series, %d series in all",
		maxLimiters, want, testutil.CollectAndCount(o))
}

func TestValidClass(t *testing.T) {
	for s, want := range map[string]bool{
		"ip": true, "user+route": true, "a+b+c": true, "": false, "+": false, "a+": false, "+a": false,
		"a++b": false, "A": false, "a1": false, "a-b": false, "a_b": false,
	} {
		if got := validClass(s); got != want {
			t.Errorf("validClass(%q) = %v, want %v", s, got, want)
		}
	}
}
