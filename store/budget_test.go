package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/store"
)

// A Budget's contexts end 15/16 of it to all of it after they are made,
// keep their values and a sooner deadline of their own, and take no
// cancellation but an ending one has already; a nil Budget bounds nothing.
func TestBudget(t *testing.T) {
	type key struct{}
	const d = 80 * time.Millisecond
	b := store.NewBudget(d)
	for i := range 200 { // over two budgets
		for _, parent := range []context.Context{context.Background(), context.WithValue(context.Background(), key{}, "v")} {
			ctx := b.Context(parent)
			end, ok := ctx.Deadline()
			if left := time.Until(end); !ok || left > d || left < d-d/16-5*time.Millisecond { // 5 ms: this goroutine's lateness
				t.Fatalf("call %d: deadline %v in %v; want one in %v to %v", i, ok, left, d-d/16, d)
			}
			if ctx.Value(key{}) != parent.Value(key{}) {
				t.Fatalf("call %d: value %v, want %v", i, ctx.Value(key{}), parent.Value(key{}))
			}
		}
		time.Sleep(time.Duration(i%3) * time.Millisecond)
	}
	soon, cancel := context.WithTimeout(context.Background(), d/2)
	defer cancel()
	if b.Context(soon) != soon {
		t.Error("a context ending sooner than the budget was not kept")
	}
	parent, stop := context.WithCancel(context.Background())
	ctx := b.Context(parent)
	stop()
	if ctx.Err() != nil {
		t.Error("the caller's cancellation ended the budget's context")
	}
	if b.Context(parent) != parent {
		t.Error("a context already done was not kept")
	}
	select {
	case <-ctx.Done():
		if ctx.Err() != context.DeadlineExceeded {
			t.Errorf("ended with %v, want the deadline", ctx.Err())
		}
	case <-time.After(2 * d):
		t.Error("the budget's context outlived the budget")
	}
	var none *store.Budget
	if none.Context(parent) != parent {
		t.Error("a nil Budget changed the context")
	}
}
