package tollgate_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeQuickstart checks that the README's quickstart is the body of
// ExampleNew_chi, which go test compiles, so that the README's code builds.
func TestReadmeQuickstart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, quick, ok := strings.Cut(string(readme), "## Quickstart")
	_, quick, ok2 := strings.Cut(quick, "```go\n")
	quick, _, ok3 := strings.Cut(quick, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md: no Go block under ## Quickstart")
	}
	src, err := os.ReadFile("middleware/chi_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "func ExampleNew_chi() {\n")
	body, _, ok2 = strings.Cut(body, "\n}\n")
	if !ok || !ok2 {
		t.Fatal("middleware/chi_example_test.go: no ExampleNew_chi")
	}
	var want strings.Builder
	for _, line := range strings.Split(body, "\n") {
		want.WriteString(strings.TrimPrefix(line, "\t") + "\n")
	}
	if got := quick; got != want.String() {
		t.Errorf("README's quickstart differs from ExampleNew_chi:\n--- README\n%s--- example\n%s", got, want.String())
	}
}
