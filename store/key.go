package store

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// maxKeyLen bounds unhashed keys, so that a hostile header cannot blow up memory.
const maxKeyLen = 128

// hashed returns key's hashed form if [Redis.Key] needs one (ok true): "#" and
// 23 bytes of SHA-256 in base64url: 32 bytes, which string() keeps on the stack.
func hashed(key string) (h [32]byte, ok bool) {
	if len(key) <= maxKeyLen && !strings.HasPrefix(key, "#") {
		return h, false
	}
	sum := sha256.Sum256([]byte(key))
	h[0] = '#'
	base64.RawURLEncoding.Encode(h[1:], sum[:23])
	return h, true
}

// tag returns the hash tag of key for [Redis.Key]: 8 hex digits of the FNV-1a of
// key's group, inside its first "{...}" (as Redis reads a hash tag), else all of
// key. A caller's braces choose which keys go together, never the slot itself.
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
