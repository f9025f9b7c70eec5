package main

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/internal/redistest"
)

// requestLine matches a line printed for a response: number, status,
// RateLimit and the optional rest.
var requestLine = regexp.MustCompile(`(?m)^  #(\d+) +(\d{3}) [A-Za-z ]+ RateLimit: "demo";r=(\d+);t=(\d+)(.*)$`)

// checkBurst checks the output of a burst of n requests and the one after
// the wait.
func checkBurst(t *testing.T, out string, n int) {
	t.Helper()
	t.Logf("output:\n%s", out)
	for _, want := range []string{
		`limit "demo": 5 requests per 2s per client IP`,
		"server: http://127.0.0.1:",
		"sending " + strconv.Itoa(n) + " requests",
		"waiting 1s, as Retry-After says...",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if c := strings.Count(out, `RateLimit-Policy: "`); c != 1 {
		t.Errorf("RateLimit-Policy printed %d times, want once", c)
	}

	lines := requestLine.FindAllStringSubmatch(out, -1)
	if len(lines) != n+1 {
		t.Fatalf("got %d request lines, want %d", len(lines), n+1)
	}
	var ok, denied int
	for i, m := range lines {
		num, status, rest := m[1], m[2], m[5]
		if num != strconv.Itoa(i+1) {
			t.Errorf("line %d: request number %s, want %d", i+1, num, i+1)
		}
		if i == 0 && !strings.Contains(rest, `RateLimit-Policy: "demo";q=5;w=2`) {
			t.Errorf("request 1: %q lacks RateLimit-Policy: \"demo\";q=5;w=2", m[0])
		}
		switch status {
		case "200":
			ok++
			if strings.Contains(rest, "Retry-After") {
				t.Errorf("request %s: Retry-After on a 200: %q", num, m[0])
			}
		case "429":
			denied++
			if !strings.Contains(rest, "Retry-After: 1") {
				t.Errorf("request %s: 429 without Retry-After: 1: %q", num, m[0])
			}
			if m[3] != "0" {
				t.Errorf("request %s: 429 with r=%s, want 0", num, m[3])
			}
		default:
			t.Errorf("request %s: status %s, want 200 or 429", num, status)
		}
	}
	if first := lines[0]; first[2] != "200" || first[3] != "4" {
		t.Errorf("request 1: status %s r=%s, want 200 r=4", first[2], first[3])
	}
	if last := lines[n]; last[2] != "200" {
		t.Errorf("request %d, after the wait: status %s, want 200", n+1, last[2])
	}
	if ok < 2 || denied < 1 {
		t.Errorf("got %d allowed and %d refused, want some of each", ok, denied)
	}
}

func TestRunMiniredis(t *testing.T) {
	t.Setenv("REDIS_ADDR", "") // the embedded miniredis
	var out bytes.Buffer
	start := time.Now()
	if err := run(context.Background(), &out, nil); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("run took %v, want a few seconds at most", d)
	}
	if !strings.HasPrefix(out.String(), "store: an embedded miniredis") {
		t.Errorf("output does not start with the store line:\n%s", out.String())
	}
	checkBurst(t, out.String(), 8)
}

func TestRunRealRedis(t *testing.T) {
	srv := redistest.Server(t)
	t.Setenv("REDIS_ADDR", srv.Addr)
	var out bytes.Buffer
	if err := run(context.Background(), &out, []string{"-n", "7"}); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.HasPrefix(out.String(), "store: Redis at "+srv.Addr+"\n") {
		t.Errorf("output does not start with the store line:\n%s", out.String())
	}
	checkBurst(t, out.String(), 7)
}

// syncBuffer is a bytes.Buffer that run may write while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRunServe(t *testing.T) {
	t.Setenv("REDIS_ADDR", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, &out, []string{"-serve", "-addr", "127.0.0.1:0"}) }()

	curl := regexp.MustCompile(`(?m)^  curl -i (http://127\.0\.0\.1:\d+/)$`)
	var url string
	for deadline := time.Now().Add(5 * time.Second); url == ""; time.Sleep(10 * time.Millisecond) {
		if m := curl.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no curl command printed within 5s:\n%s", out.String())
		}
	}
	if !strings.Contains(out.String(), `limit "demo": 5 requests per 30s per client IP`) {
		t.Errorf("output lacks the serve limit:\n%s", out.String())
	}

	client := &http.Client{Timeout: 5 * time.Second}
	for i := 1; i <= 6; i++ {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusOK
		if i == 6 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, want)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"demo";q=5;w=30` {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i, got, `"demo";q=5;w=30`)
		}
	}
	client.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return within 5s of the cancel")
	}
	if !strings.HasSuffix(out.String(), "shutting down\n") {
		t.Errorf("output does not end with the shutdown line:\n%s", out.String())
	}
}

func TestRunBadArguments(t *testing.T) {
	t.Setenv("REDIS_ADDR", "")
	for _, args := range [][]string{
		{"-n", "0"},
		{"-bogus"},
		{"extra"},
		{"-addr", "not an address"},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), &out, args); err == nil {
			t.Errorf("run %q: got nil error, want one", args)
		}
	}
}
