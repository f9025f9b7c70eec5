package store

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// maxKeyLen is the longest key kept as it is; longer keys are hashed so that
// a hostile header cannot blow up Redis or process memory.
const maxKeyLen = 128

// hashKey replaces a long key by "#" and its SHA-256 in unpadded base64url
// (44 bytes in all). A Redis Cluster hash tag ("{...}", up to 64 bytes) in the
// key is kept in front, so keys that must share a slot still do.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	h := "#" + base64.RawURLEncoding.EncodeToString(sum[:])
	if tag, ok := hashTag(key); ok && len(tag) <= 64 {
		return "{" + tag + "}" + h
	}
	return h
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
