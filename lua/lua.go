package lua

import (
	"crypto/sha1"
	_ "embed"
	"fmt"
)

// TokenBucket is the source of the token-bucket script (tokenbucket.lua).
// The package documentation describes its KEYS, ARGV and reply.
//
//go:embed tokenbucket.lua
var TokenBucket string

// TokenBucketSHA1 is the hex SHA1 digest of [TokenBucket], the name under
// which Redis caches the script for EVALSHA.
var TokenBucketSHA1 = fmt.Sprintf("%x", sha1.Sum([]byte(TokenBucket)))
