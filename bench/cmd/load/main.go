// Command load sends HTTP/1.1 GET requests over keep-alive connections for a
// fixed duration and reports requests per second, latency percentiles and the
// count of each status.
//
//	load -url http://127.0.0.1:8080/ -c 64 -d 5s -keys 10000
//
// Each of the -c connections sends one request at a time (closed loop). The
// X-Client header of each request is "<key-prefix><i>" with i drawn
// uniformly from [0, -keys), so -keys 1 floods one client. Requests are
// written and responses parsed on the raw connection, without net/http's
// client machinery, to leave the CPU to the server.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Result is what a run measured; -json prints it.
type Result struct {
	Connections int           `json:"connections"`
	Seconds     float64       `json:"seconds"`
	Requests    int64         `json:"requests"` // answered requests
	RPS         float64       `json:"rps"`
	P50us       float64       `json:"p50_us"`
	P99us       float64       `json:"p99_us"`
	Status      map[int]int64 `json:"status"`
	Errors      int64         `json:"errors"` // failed requests and connections
	FirstError  string        `json:"first_error,omitempty"`

	statusOrder []int
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		rawURL   = flag.String("url", "", "URL to GET, http://host:port/path (required)")
		conns    = flag.Int("c", 64, "connections, each with one request in flight")
		duration = flag.Duration("d", 5*time.Second, "how long to send requests")
		keys     = flag.Int("keys", 1, "distinct X-Client values; 0 sends no X-Client")
		prefix   = flag.String("key-prefix", "client-", "prefix of the X-Client values")
		timeout  = flag.Duration("timeout", 5*time.Second, "deadline of one request")
		asJSON   = flag.Bool("json", false, "print the result as JSON")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	u, err := url.Parse(*rawURL)
	switch {
	case *rawURL == "":
		return errors.New("-url is required")
	case err != nil:
		return fmt.Errorf("-url: %w", err)
	case u.Scheme != "http" || u.Host == "":
		return fmt.Errorf("-url %q: want http://host:port/path", *rawURL)
	case *conns < 1:
		return fmt.Errorf("-c %d: want at least 1", *conns)
	case *duration <= 0 || *timeout <= 0:
		return errors.New("-d and -timeout must be positive")
	case *keys < 0:
		return fmt.Errorf("-keys %d: want 0 or more", *keys)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	w := &worker{
		addr:    addr,
		head:    []byte("GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\n"),
		keys:    *keys,
		prefix:  *prefix,
		timeout: *timeout,
	}
	res := measure(w, *conns, *duration)
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("%d connections, %.1fs: %d requests, %.0f req/s, p50 %s, p99 %s, errors %d",
		res.Connections, res.Seconds, res.Requests, res.RPS,
		time.Duration(res.P50us*1e3).Round(time.Microsecond),
		time.Duration(res.P99us*1e3).Round(time.Microsecond), res.Errors)
	for _, s := range res.statusOrder {
		fmt.Printf(", %d: %d", s, res.Status[s])
	}
	fmt.Println()
	if res.FirstError != "" {
		fmt.Println("first error:", res.FirstError)
	}
	return nil
}

// worker holds what every connection shares.
type worker struct {
	addr    string
	head    []byte // request line and Host header
	keys    int
	prefix  string
	timeout time.Duration
}

// tally is one connection's count.
type tally struct {
	lat      []time.Duration
	status   map[int]int64
	errors   int64
	firstErr error
}

func measure(w *worker, conns int, d time.Duration) Result {
	tallies := make([]*tally, conns)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i := range tallies {
		t := &tally{status: map[int]int64{}, lat: make([]time.Duration, 0, 4096)}
		tallies[i] = t
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(t, deadline)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	res := Result{Connections: conns, Seconds: elapsed.Seconds(), Status: map[int]int64{}}
	var lat []time.Duration
	for _, t := range tallies {
		lat = append(lat, t.lat...)
		for s, n := range t.status {
			res.Status[s] += n
		}
		res.Errors += t.errors
		if t.firstErr != nil && res.FirstError == "" {
			res.FirstError = t.firstErr.Error()
		}
	}
	for s := range res.Status {
		res.statusOrder = append(res.statusOrder, s)
	}
	slices.Sort(res.statusOrder)
	res.Requests = int64(len(lat))
	res.RPS = float64(res.Requests) / elapsed.Seconds()
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50us = float64(lat[len(lat)/2]) / 1e3
		res.P99us = float64(lat[len(lat)*99/100]) / 1e3
	}
	return res
}

// loop sends requests on one connection until deadline, reconnecting after
// an error or a response that closes the connection.
func (w *worker) loop(t *tally, deadline time.Time) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	buf := make([]byte, 0, 256)
	var conn net.Conn
	var br *bufio.Reader
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	fail := func(err error) {
		t.errors++
		if t.firstErr == nil {
			t.firstErr = err
		}
		if conn != nil {
			conn.Close()
			conn = nil
		}
		time.Sleep(10 * time.Millisecond) // no busy loop against a dead server
	}
	for {
		now := time.Now()
		if !now.Before(deadline) {
			return
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", w.addr, w.timeout)
			if err != nil {
				fail(err)
				continue
			}
			conn, br = c, bufio.NewReaderSize(c, 4096)
		}
		buf = append(buf[:0], w.head...)
		if w.keys > 0 {
			buf = append(buf, "X-Client: "...)
			buf = append(buf, w.prefix...)
			buf = strconv.AppendInt(buf, int64(rng.IntN(w.keys)), 10)
			buf = append(buf, "\r\n"...)
		}
		buf = append(buf, "\r\n"...)

		t0 := time.Now()
		conn.SetDeadline(t0.Add(w.timeout))
		if _, err := conn.Write(buf); err != nil {
			fail(err)
			continue
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			fail(err)
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			fail(err)
			continue
		}
		t.lat = append(t.lat, time.Since(t0))
		t.status[resp.StatusCode]++
		if resp.Close {
			conn.Close()
			conn = nil
		}
	}
}
