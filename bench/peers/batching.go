//go:build tollgate_batching

package peers

import "github.com/tollgate-go/tollgate/store"

// Built with -tags tollgate_batching: tollgate's Redis store can pipeline
// concurrent decisions.
func init() { batching = store.WithBatching }
