package store

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestTableAgainstMap adds, removes and finds buckets at random in one
// table, up to 7/8 of its slots used, against a map. The hashes are chosen
// to collide: a few groups and a few fingerprints, including the ones that
// must be moved off the free slots' control bytes (top bytes 0 and 1), so
// that keys probe past full groups, share fingerprints and reuse
// tombstones.
func TestTableAgainstMap(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups int
		fps    uint64 // distinct top bytes
		homes  uint64 // distinct home groups
	}{
		{"one fingerprint", 8, 1, 8},
		{"two fingerprints one home", 8, 2, 1},
		{"spread", 64, 256, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			tab := newTable(tc.groups)
			live := map[string]*cell{}
			used, rebuilt := 0, 0
			var keys []string
			for i := range 4 * tc.groups * groupSlots {
				key := "k" + strconv.Itoa(i)
				keys = append(keys, key)
			}
			hashOf := func(key string) uint64 {
				n, _ := strconv.Atoi(key[1:])
				return uint64(n)%tc.fps<<56 | uint64(n*7)%tc.homes
			}
			for step := range 20000 {
				key := keys[rng.IntN(len(keys))]
				h := hashOf(key)
				got := tab.find(h, key)
				if want := live[key]; got != want {
					t.Fatalf("step %d: find(%q) = %p, want %p", step, key, got, want)
				}
				switch {
				case got != nil && rng.IntN(2) == 0:
					if !tab.remove(got) {
						t.Fatalf("step %d: remove(%q) found nothing", step, key)
					}
					if tab.remove(got) {
						t.Fatalf("step %d: removed %q twice", step, key)
					}
					delete(live, key)
				case got == nil && 8*(len(live)+1) <= 7*tab.slots():
					if 8*(used+1) > 7*tab.slots() {
						// As a shard does: rebuild, clear of tombstones.
						nt := newTable(tc.groups)
						for i := range tab.slots() {
							if c := tab.at(i); c != nil {
								nt.add(c)
							}
						}
						tab, used = nt, len(live)
						rebuilt++
					}
					c := &cell{h: h, key: key}
					if tab.add(c) {
						used++
					}
					live[key] = c
				}
			}
			n := 0
			for i := range tab.slots() {
				if c := tab.at(i); c != nil {
					n++
					if live[c.key] != c {
						t.Errorf("slot %d holds %q, which is not live", i, c.key)
					}
				}
			}
			if n != len(live) {
				t.Errorf("%d buckets in the slots, want %d", n, len(live))
			}
			if rebuilt == 0 || len(live) < tc.groups*groupSlots/4 {
				t.Errorf("%d rebuilds, %d live buckets at the end: the test did not fill the table", rebuilt, len(live))
			}
		})
	}
}

func TestFingerprintAndMatches(t *testing.T) {
	for top := range uint64(256) {
		fp := fingerprint(top << 56)
		if fp < ctrlFull || fp > 0xff {
			t.Fatalf("fingerprint of top byte %#x = %#x, want within [%#x, 0xff]", top, fp, ctrlFull)
		}
	}
	// Every slot that holds fp is reported, and byte 7 never is.
	for j := range groupSlots {
		for _, fp := range []uint64{ctrlEmpty, ctrlTomb, ctrlFull, 0x80, 0xff} {
			var ctrl uint64
			for k := range groupSlots {
				b := (fp + 1 + uint64(k)) & 0xff // anything but fp
				if b == fp {
					b++
				}
				ctrl |= (b & 0xff) << (8 * k)
			}
			ctrl = ctrl&^(0xff<<(8*j)) | fp<<(8*j)
			m := matches(ctrl, fp)
			if m&(0x80<<(8*j)) == 0 {
				t.Errorf("matches(%#x, %#x) = %#x misses slot %d", ctrl, fp, m, j)
			}
			if m>>56 != 0 {
				t.Errorf("matches(%#x, %#x) = %#x reports byte 7", ctrl, fp, m)
			}
		}
	}
	if hasEmpty(0x0001010101010101) {
		t.Error("a group of tombstones has an empty slot")
	}
	if !hasEmpty(0x0002020202020200) {
		t.Error("a group whose slot 0 is empty has none")
	}
}
