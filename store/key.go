package store

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"unsafe"
)

// maxKeyLen is the longest key kept as it is; longer keys are hashed so that
// a hostile header cannot blow up Redis or process memory.
const maxKeyLen = 128

// hashKey replaces a long key by "#" and its SHA-256 in unpadded base64url
// (44 bytes in all). A Redis Cluster hash tag ("{...}", up to 64 bytes) in the
// key is kept in front, so keys that must share a slot still do.
func hashKey(key string) string {
	var b [maxHashedKey]byte
	return string(appendHashKey(b[:0], key))
}

// maxHashedKey is the longest key hashKey returns: a tag of 64 bytes in
// braces, "#" and 43 characters of base64.
const maxHashedKey = 2 + 64 + 1 + 43

// appendHashKey appends hashKey(key) to dst.
func appendHashKey(dst []byte, key string) []byte {
	// The key's bytes, not copied (a copy of a long key allocates):
	// Sum256 only reads them.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(key), len(key)))
	if tag, ok := hashTag(key); ok && len(tag) <= 64 {
		dst = append(dst, '{')
		dst = append(dst, tag...)
		dst = append(dst, '}')
	}
	dst = append(dst, '#')
	return base64.RawURLEncoding.AppendEncode(dst, sum[:])
}

// hashTag returns the part of key that Redis Cluster hashes, when the key
// has a non-empty "{...}" tag.
func hashTag(key string) (string, bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return "", false
	}
	close := strings.IndexByte(key[open+1:], '}')
	if close <= 0 {
		return "", false
	}
	return key[open+1 : open+1+close], true
}
