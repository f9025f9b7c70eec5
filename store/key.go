package store

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// maxKeyLen is the longest key kept as it is; longer keys are hashed so that
// a hostile header cannot blow up Redis or process memory.
const maxKeyLen = 128

// keptAsIs reports whether both stores keep key's bucket under key itself.
// Otherwise, when key is longer than maxKeyLen or starts with '#', they keep
// it under hashKey(key): no key is kept under the hashed form of another,
// since a key kept as it is never starts with '#'.
func keptAsIs(key string) bool {
	return len(key) <= maxKeyLen && !strings.HasPrefix(key, "#")
}

// hashKey returns "#" and 23 bytes (184 bits) of key's SHA-256 in unpadded
// base64url: 32 bytes, which a string conversion keeps on the stack.
func hashKey(key string) (b [32]byte) {
	sum := sha256.Sum256([]byte(key))
	b[0] = '#'
	base64.RawURLEncoding.Encode(b[1:], sum[:23])
	return b
}

// group returns what decides the Redis Cluster slot (or Ring shard) of key:
// the part inside its first "{...}", as Redis reads a hash tag, else the
// whole key. Keys of one group are decided in one script call by TakeAll.
func group(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			return key[open+1 : open+1+n]
		}
	}
	return key
}

// tag returns the hash tag that the store puts in front of key on a Cluster
// or Ring: 8 hex digits of the FNV-1a hash of key's group. The tag is the
// library's, so a caller's braces choose only which keys go together, never
// the slot itself (a subject cannot name one).
func tag(key string) [8]byte {
	g, sum := group(key), uint32(2166136261)
	for i := 0; i < len(g); i++ {
		sum = (sum ^ uint32(g[i])) * 16777619
	}
	var b [8]byte
	for i := range b {
		b[i] = "0123456789abcdef"[sum>>(28-4*i)&0xf]
	}
	return b
}
