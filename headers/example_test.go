package headers_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tollgate-go/tollgate/headers"
)

// Two limiters decide one request: a per-user limit of 100 a minute, which
// this client has used up, and a global limit of 5000 a second. Each writes
// its quota; the List fields carry both, the single-value fields the
// tightest, and the 429 gets a Retry-After no earlier than the exhausted
// limit's reset.
func Example() {
	h := make(http.Header)
	now := time.Now()

	headers.Write(h, headers.Default, headers.Quota{
		Name: "per-user", Limit: 100, Window: time.Minute,
		Remaining: 0, Reset: 600 * time.Millisecond,
	}, now)
	headers.Write(h, headers.Default, headers.Quota{
		Name: "global", Limit: 5000, Window: time.Second,
		Remaining: 4211, Reset: 0,
	}, now)
	headers.WriteRetryAfter(h, 600*time.Millisecond)

	for _, name := range []string{
		"RateLimit-Policy", "RateLimit",
		"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
		"Retry-After",
	} {
		fmt.Printf("%s: %s\n", name, h.Get(name))
	}
	// Output:
	// RateLimit-Policy: "per-user";q=100;w=60, "global";q=5000;w=1
	// RateLimit: "per-user";r=0;t=1, "global";r=4211;t=0
	// RateLimit-Limit: 100
	// RateLimit-Remaining: 0
	// RateLimit-Reset: 1
	// Retry-After: 1
}

// The X-RateLimit fields can be added to the default set, here with the
// reset as a Unix time, as GitHub sends it.
func ExampleWrite_xRateLimitEpoch() {
	p := headers.Default | headers.XRateLimitEpoch
	if err := p.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	h := make(http.Header)
	now := time.Unix(1_700_000_000, 0)
	headers.Write(h, p, headers.Quota{
		Name: "api", Limit: 60, Window: time.Hour, Remaining: 59, Reset: 60 * time.Second,
	}, now)
	fmt.Println(h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"))
	// Output:
	// 59 1700000060
}

func ExampleProfile_Validate() {
	err := (headers.XRateLimitEpoch | headers.XRateLimitDelta).Validate()
	fmt.Println(err)
	// Output:
	// headers: invalid profile XRateLimitEpoch|XRateLimitDelta: XRateLimitEpoch and XRateLimitDelta write the same fields; choose one
}

func ExampleSeconds() {
	fmt.Println(headers.Seconds(time.Nanosecond), headers.Seconds(time.Second), headers.Seconds(time.Second+time.Nanosecond))
	// Output:
	// 1 1 2
}
