package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
)

// accResult is cmd/accuracy's JSON.
type accResult struct {
	Lib        string  `json:"lib"`
	Instances  int     `json:"instances"`
	Goroutines int     `json:"goroutines"`
	Seconds    float64 `json:"seconds"`
	Decisions  int64   `json:"decisions"`
	Allowed    int64   `json:"allowed"`
	Errors     int64   `json:"errors"`
	Ideal      float64 `json:"ideal"`
	FirstError string  `json:"first_error"`
}

// The accuracy limit: 100/s, burst 50, for accDur, from 64 goroutines on 4
// instances.
const (
	accRate       = 100
	accBurst      = 50
	accGoroutines = 64
	accInstances  = 4
)

// accuracy runs cmd/accuracy on the report's redis-server.
func (r *report) accuracy(ctx context.Context) error {
	if err := r.flushRedis(ctx); err != nil {
		return err
	}
	args := []string{"-redis", r.redis.Addr, "-d", r.cfg.accDur.String(),
		"-rate", strconv.Itoa(accRate), "-burst", strconv.Itoa(accBurst),
		"-goroutines", strconv.Itoa(accGoroutines), "-instances", strconv.Itoa(accInstances),
		"-baseline", "-json"}
	args = append(args, "-batching", "0")
	out, err := runCmd(ctx, r.bin("accuracy"), args...)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var res accResult
		if jerr := json.Unmarshal(sc.Bytes(), &res); jerr != nil {
			return fmt.Errorf("accuracy printed %q: %w", sc.Text(), jerr)
		}
		logf("accuracy %s, %d instance(s): %d allowed of %d (ideal %.0f), %d errors",
			res.Lib, res.Instances, res.Allowed, res.Decisions, res.Ideal, res.Errors)
		r.accRows = append(r.accRows, res)
	}
	return err
}
