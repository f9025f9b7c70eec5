//go:build tollgate_coalescing

package peers

import "github.com/tollgate-go/tollgate/store"

// Built with -tags tollgate_coalescing: tollgate's Redis store can let the
// Takes of one bucket in a pipeline share one script call.
func init() { coalescing = store.WithCoalescing }
