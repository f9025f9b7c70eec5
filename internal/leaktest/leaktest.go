// Package leaktest checks that a test leaves no goroutines behind.
package leaktest

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// Check records the goroutines running now and, when t ends, fails it if
// goroutines started since are still running after a grace period of
// two seconds. Call it first in a test, before anything that starts
// goroutines registers its own cleanup, so that those cleanups run before
// the check.
func Check(t testing.TB) {
	t.Helper()
	before := map[string]bool{}
	for _, g := range goroutines() {
		before[g.id] = true
	}
	t.Cleanup(func() {
		var leaked []string
		deadline := time.Now().Add(2 * time.Second)
		for {
			leaked = leaked[:0]
			for _, g := range goroutines() {
				if !before[g.id] && !g.ignorable() {
					leaked = append(leaked, g.stack)
				}
			}
			if len(leaked) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if len(leaked) > 0 {
			t.Errorf("leaktest: %d goroutine(s) leaked:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
	})
}

type goroutine struct{ id, stack string }

func (g goroutine) ignorable() bool {
	for _, s := range []string{
		"testing.(*T).Run", "testing.tRunner", "testing.runTests",
		"runtime.goexit0", "created by runtime.gc", "runtime.MHeap_Scavenger",
		"signal.signal_recv", "os/signal.loop", "testing.(*M).",
		"runtime/trace.Start",
	} {
		if strings.Contains(g.stack, s) && !strings.Contains(g.stack, "tollgate") {
			return true
		}
	}
	return false
}

func goroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for _, s := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(s, "\n")
		// "goroutine 18 [running]:"
		f := strings.Fields(header)
		if len(f) < 2 {
			continue
		}
		gs = append(gs, goroutine{id: f[1], stack: s})
	}
	return gs
}
