package lua

import (
	"crypto/sha1"
	_ "embed"
	"fmt"
)

// TokenBucket is the source of tokenbucket.lua; the package doc gives its protocol.
//
//go:embed tokenbucket.lua
var TokenBucket string

// TokenBucketSHA1 is the hex SHA1 of [TokenBucket], its name for EVALSHA.
var TokenBucketSHA1 = fmt.Sprintf("%x", sha1.Sum([]byte(TokenBucket)))
