//go:build tollgate_denycache

package peers

import "github.com/tollgate-go/tollgate/middleware"

// Built with -tags tollgate_denycache: tollgate's middleware can answer a
// key known to be denied without asking the store.
func init() { denyCache = middleware.WithDenyCache }
