package store

import (
	"math/bits"
	"sync/atomic"
)

// A cellTable is a shard's open-addressing hash table of buckets, read
// without a lock and written under the shard's lock (see memShard).
//
// Its slots come in groups of seven, each group one cache line: a word of
// control bytes, one per slot, then the slots' pointers. A control byte
// says whether its slot is empty, a tombstone (its bucket was removed), or
// holds a bucket, and then it holds 8 bits of the key's hash as well: a
// lookup compares all seven bytes of a group at once and reads only the
// buckets whose byte matches, so that it rarely reads a bucket of another
// key (a cache miss each) and the table costs about 9 bytes per slot. A key
// lives in the first group of its probe sequence (its hash's group, then
// the next ones) that had a free slot when it was added; a lookup stops at a
// group with an empty slot, and tombstones become empty again only when the
// table is rebuilt.
type cellTable struct {
	groups []group
	mask   uint64 // len(groups) - 1, a power of two minus one
}

const groupSlots = 7

// minTable is the number of groups of a shard's smallest table.
const minTable = 2

// A group is 64 bytes: tables are allocated in sizes that are powers of
// two of them, which the allocator aligns to 64 bytes.
type group struct {
	// ctrl holds the control bytes of the slots, slot j in byte j (the
	// least significant first); byte 7 is unused and always 0.
	ctrl atomic.Uint64
	c    [groupSlots]atomic.Pointer[cell]
}

// Control bytes. A slot that holds a bucket has its key's fingerprint,
// which is at least ctrlFull.
const (
	ctrlEmpty = 0
	ctrlTomb  = 1
	ctrlFull  = 2

	lsbs = 0x0001010101010101 // the least significant bit of each slot's byte
	msbs = 0x0080808080808080 // the most significant bit of each slot's byte
)

// fingerprint returns the control byte of a key whose hash is h: its top
// 8 bits, which neither the shard (bits 32 and up) nor the group (the low
// bits) is chosen by, unless they are a free slot's.
func fingerprint(h uint64) uint64 {
	if fp := h >> 56; fp >= ctrlFull {
		return fp
	}
	return h>>56 + ctrlFull
}

// matches returns the slots of a group whose control bytes may be fp, as
// the most significant bits of their bytes. It may report a slot whose byte
// is fp+1 just above one that is fp (the subtraction borrows), never miss
// one that is fp: callers check what they find.
func matches(ctrl, fp uint64) uint64 {
	x := ctrl ^ (lsbs * fp)
	return (x - lsbs) &^ x & msbs
}

// hasEmpty reports whether a group has an empty slot.
func hasEmpty(ctrl uint64) bool { return matches(ctrl, ctrlEmpty) != 0 }

// slotOf returns the slot of the lowest bit of m, a result of matches.
func slotOf(m uint64) int { return bits.TrailingZeros64(m) / 8 }

func newTable(groups int) *cellTable {
	return &cellTable{groups: make([]group, groups), mask: uint64(groups - 1)}
}

// slots returns how many slots t has.
func (t *cellTable) slots() int { return len(t.groups) * groupSlots }

// find returns the bucket of key, whose hash is h, or nil. Without the
// shard's lock it may miss a bucket that is being added or moved to a new
// table, never return another key's. The first slot that matches in the
// key's own group is looked at inline: most keys are found there.
func (t *cellTable) find(h uint64, key string) *cell {
	g := &t.groups[h&t.mask]
	if m := matches(g.ctrl.Load(), fingerprint(h)); m != 0 {
		if c := g.c[slotOf(m)].Load(); c != nil && c.key == key {
			return c
		}
	}
	return t.probe(h, key)
}

// probe is find, every slot that matches in the probe sequence.
func (t *cellTable) probe(h uint64, key string) *cell {
	fp := fingerprint(h)
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		g := &t.groups[i]
		ctrl := g.ctrl.Load()
		for m := matches(ctrl, fp); m != 0; m &= m - 1 {
			if c := g.c[slotOf(m)].Load(); c != nil && c.key == key {
				return c
			}
		}
		if hasEmpty(ctrl) {
			return nil
		}
	}
}

// add puts c in the table, which has a free slot and does not hold c's
// key, and reports whether it took an empty slot (not a tombstone's). The
// caller holds the shard's lock.
func (t *cellTable) add(c *cell) (fresh bool) {
	fp := fingerprint(c.h)
	for i := c.h & t.mask; ; i = (i + 1) & t.mask {
		g := &t.groups[i]
		ctrl := g.ctrl.Load()
		for j := range groupSlots {
			if b := ctrl >> (8 * j) & 0xff; b < ctrlFull {
				// The pointer first: a lookup that reads the new byte
				// finds the bucket it stands for.
				g.c[j].Store(c)
				g.ctrl.Store(ctrl&^(0xff<<(8*j)) | fp<<(8*j))
				return b == ctrlEmpty
			}
		}
	}
}

// remove takes c out of the table and reports whether it was there. The
// caller holds the shard's lock.
func (t *cellTable) remove(c *cell) bool {
	fp := fingerprint(c.h)
	for i := c.h & t.mask; ; i = (i + 1) & t.mask {
		g := &t.groups[i]
		ctrl := g.ctrl.Load()
		for m := matches(ctrl, fp); m != 0; m &= m - 1 {
			if j := slotOf(m); g.c[j].Load() == c {
				g.ctrl.Store(ctrl&^(0xff<<(8*j)) | ctrlTomb<<(8*j))
				g.c[j].Store(nil)
				return true
			}
		}
		if hasEmpty(ctrl) {
			return false
		}
	}
}

// at returns the bucket in slot i (0 <= i < t.slots()), or nil.
func (t *cellTable) at(i int) *cell {
	g := &t.groups[i/groupSlots]
	if g.ctrl.Load()>>(8*(i%groupSlots))&0xff < ctrlFull {
		return nil
	}
	return g.c[i%groupSlots].Load()
}
