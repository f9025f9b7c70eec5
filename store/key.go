package store

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// maxKeyLen is the longest key kept as it is; longer keys are hashed so that
// a hostile header cannot blow up Redis or process memory.
const maxKeyLen = 128

// hashed returns the name the Redis store keeps key's bucket under when key is
// longer than maxKeyLen or starts with '#' (ok true; then no key is kept
// under the hashed form of another): "#" and 23 bytes of its SHA-256 in
// base64url, 32 bytes, which a conversion to string keeps on the stack.
func hashed(key string) (h [32]byte, ok bool) {
	if len(key) <= maxKeyLen && !strings.HasPrefix(key, "#") {
		return h, false
	}
	sum := sha256.Sum256([]byte(key))
	h[0] = '#'
	base64.RawURLEncoding.Encode(h[1:], sum[:23])
	return h, true
}

// tag returns the store's hash tag for key on a Cluster or Ring ([Redis.Key]):
// 8 hex digits of the FNV-1a hash of key's group, the part inside its first
// "{...}" (as Redis reads a hash tag), else the whole key. A caller's braces
// choose only which keys go together (one script call in TakeAll), never the
// slot itself.
func tag(key string) (b [8]byte) {
	g := key
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			g = key[open+1 : open+1+n]
		}
	}
	sum := uint32(2166136261)
	for i := 0; i < len(g); i++ {
		sum = (sum ^ uint32(g[i])) * 16777619
	}
	hex.Encode(b[:], binary.BigEndian.AppendUint32(nil, sum))
	return b
}
