package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	envSentinelAddrs  = "REDIS_SENTINEL_ADDRS"
	envSentinelMaster = "REDIS_SENTINEL_MASTER"

	defaultMasterName    = "mymaster"
	sentinelCount        = 3
	sentinelQuorum       = 2
	sentinelReadyTimeout = 30 * time.Second
)

// SentinelOption configures Sentinel.
type SentinelOption func(*sentinelConfig)

type sentinelConfig struct {
	masterName string
}

// MasterName sets the name under which the sentinels monitor the master
// (default "mymaster"). The name must not be empty or contain white space or
// quotes, because it is written into the sentinels' configuration files. With
// REDIS_SENTINEL_ADDRS set, REDIS_SENTINEL_MASTER takes precedence over
// MasterName when both are given.
func MasterName(name string) SentinelOption {
	return func(c *sentinelConfig) { c.masterName = name }
}

// SentinelInstance is a master with its replica, monitored by Redis Sentinel,
// either started by Sentinel or external (given by REDIS_SENTINEL_ADDRS).
//
// Its methods report failures to the testing.TB they are given, so call them
// from that test's goroutine.
type SentinelInstance struct {
	// MasterName is the name under which the sentinels monitor the master.
	MasterName string
	// Master is the server that was the master when Sentinel returned.
	// After a failover it is no longer the master (or no longer running); use
	// CurrentMaster to find the address of the master the sentinels report.
	Master *Instance
	// Replicas are the servers that were replicas of Master when Sentinel
	// returned: one when started by Sentinel, the replicas that the first
	// sentinel reported as up when external.
	Replicas []*Instance
	// Sentinels are the sentinel processes (redis-server --sentinel). They
	// can be paused, killed and restarted like any other Instance; a
	// restarted sentinel reads back the configuration it has rewritten, so it
	// still monitors the master and knows the other sentinels. For SENTINEL
	// commands, use redis.NewSentinelClient with a sentinel's Addr, or Do on
	// the sentinel's Client.
	Sentinels []*Instance
	// SentinelAddrs are the sentinels' addresses, host:port, in the order of
	// Sentinels.
	SentinelAddrs []string
	// External is true when nothing was started by this package.
	External bool

	t testing.TB
}

// Sentinel starts a Redis Sentinel setup on 127.0.0.1: a master, one replica
// of it and three sentinels that monitor the master under the name
// "mymaster" (see MasterName) with a quorum of 2. It returns once the setup
// is ready for a failover: the replica reports master_link_status:up, and
// every sentinel reports the master for that name, knows the other two
// sentinels and knows the replica (connected, with its link to the master
// up).
//
// The master and the replica are redis-servers started like Server's (each
// with its own temporary directory, --save "" --appendonly no), with
// --repl-diskless-sync-delay 0 so that a replica syncs at once instead of
// after 5 s; the replica has --replicaof 127.0.0.1 <master port>. Each
// sentinel is "redis-server sentinel.conf --sentinel" with a configuration
// file of its own in its temporary directory, which it rewrites as it learns
// about the setup. The sentinels use down-after-milliseconds 1000,
// failover-timeout 5000 and parallel-syncs 1, so that a killed master is
// usually replaced within a few seconds (and, after a split vote, within
// about 15 s). Every process is stopped in t.Cleanup.
//
// If REDIS_SENTINEL_ADDRS is set (comma-separated host:port of sentinels),
// Sentinel starts nothing and returns an external SentinelInstance for the
// master named by REDIS_SENTINEL_MASTER (or, if that is not set, by
// MasterName, or "mymaster"), once every listed sentinel reports a master for
// that name and the master answers PING. An external setup is not flushed:
// tests that may run against one must use unique key prefixes.
//
// When redis-server is not installed, Sentinel skips the test (or fails it
// when CI=true); see Require.
func Sentinel(t testing.TB, opts ...SentinelOption) *SentinelInstance {
	t.Helper()
	cfg := sentinelConfig{masterName: defaultMasterName}
	for _, o := range opts {
		o(&cfg)
	}
	if env := os.Getenv(envSentinelAddrs); env != "" {
		name := cfg.masterName
		if m := os.Getenv(envSentinelMaster); m != "" {
			name = m
		}
		return externalSentinel(t, env, name)
	}
	if cfg.masterName == "" || strings.ContainsFunc(cfg.masterName, func(r rune) bool {
		return r <= ' ' || r == '"' || r == '\'' || r == 0x7f
	}) {
		t.Fatalf("redistest: Sentinel: master name %q is empty or has white space, quotes or control characters", cfg.masterName)
	}
	requireBinaries(t, envSentinelAddrs, serverBin)

	s := &SentinelInstance{MasterName: cfg.masterName, t: t}
	dataArgs := func(port int, dir string) []string {
		return []string{
			"--save", "",
			"--appendonly", "no",
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--dir", dir,
			// A master starts a sync at once instead of after 5 s. Every
			// data node gets it, since a replica may be promoted.
			"--repl-diskless-sync-delay", "0",
		}
	}
	s.Master = startInstance(t, false, dataArgs)
	masterPort := strconv.Itoa(s.Master.Port)
	s.Replicas = append(s.Replicas, startInstance(t, false, func(port int, dir string) []string {
		return append(dataArgs(port, dir), "--replicaof", "127.0.0.1", masterPort)
	}))
	// Runs before the processes' own cleanups (which then have nothing to
	// do) and stops all processes at once rather than one after another.
	t.Cleanup(s.stopAll)

	// Sentinels learn about replicas from the master's INFO, which they ask
	// for at once and then only every 10 s: start them once the replica is
	// in sync, so that they see it straight away.
	s.waitFor(sentinelReadyTimeout, "replica not in sync", s.checkReplicas)

	for k := 0; k < sentinelCount; k++ {
		sn := startInstance(t, false, func(port int, dir string) []string {
			conf := filepath.Join(dir, "sentinel.conf")
			name := s.MasterName
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\n"+
				"sentinel monitor %s 127.0.0.1 %s %d\n"+
				"sentinel down-after-milliseconds %s 1000\n"+
				"sentinel failover-timeout %s 5000\n"+
				"sentinel parallel-syncs %s 1\n",
				port, name, masterPort, sentinelQuorum, name, name, name)
			// Written afresh for every port tried; a sentinel rewrites it
			// later, and Restart reuses what it wrote.
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				t.Fatalf("redistest: writing %s: %v", conf, err)
			}
			return []string{conf, "--sentinel"}
		})
		s.Sentinels = append(s.Sentinels, sn)
		s.SentinelAddrs = append(s.SentinelAddrs, sn.Addr)
	}
	s.waitFor(sentinelReadyTimeout, "sentinels not ready", s.checkSentinels)
	return s
}

// externalSentinel returns a SentinelInstance for the sentinels listed in env,
// once they report a master for name and that master answers.
func externalSentinel(t testing.TB, env, name string) *SentinelInstance {
	t.Helper()
	s := &SentinelInstance{MasterName: name, External: true, t: t}
	for _, a := range strings.Split(env, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		s.Sentinels = append(s.Sentinels, externalInstance(t, a, envSentinelAddrs))
		s.SentinelAddrs = append(s.SentinelAddrs, a)
	}
	if len(s.Sentinels) == 0 {
		t.Fatalf("redistest: %s=%q names no address", envSentinelAddrs, env)
	}
	var master string
	var replicas []map[string]string
	s.waitFor(readyTimeout, envSentinelAddrs+" is set, but the sentinels are not ready", func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		master = ""
		for _, a := range s.SentinelAddrs {
			addr, err := masterAddrByName(ctx, a, name)
			if err != nil {
				return fmt.Sprintf("sentinel %s: get-master-addr-by-name %s: %v", a, name, err)
			}
			if master == "" {
				master = addr
			}
		}
		if err := checkReady(master, nil); err != nil {
			return fmt.Sprintf("master %s: %v", master, err)
		}
		cl := quickSentinelClient(s.SentinelAddrs[0])
		defer cl.Close()
		var err error
		if replicas, err = cl.Replicas(ctx, name).Result(); err != nil {
			return fmt.Sprintf("sentinel %s: SENTINEL replicas %s: %v", s.SentinelAddrs[0], name, err)
		}
		return ""
	})
	s.Master = externalNode(t, master)
	for _, r := range replicas {
		if !hasFlag(r["flags"], "s_down", "o_down", "disconnected") {
			s.Replicas = append(s.Replicas, externalNode(t, net.JoinHostPort(r["ip"], r["port"])))
		}
	}
	return s
}

// externalNode returns an external Instance for addr, which a sentinel
// reported, without checking that it answers.
func externalNode(t testing.TB, addr string) *Instance {
	t.Helper()
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("redistest: a sentinel reported a bad address %q: %v", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatalf("redistest: a sentinel reported a bad port in %q: %v", addr, err)
	}
	return &Instance{Addr: addr, Port: port, External: true, t: t}
}

// waitFor waits until check returns "", or fails the test with what, the last
// problem check reported and the logs' tails.
func (s *SentinelInstance) waitFor(timeout time.Duration, what string, check func() string) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		problem := check()
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: Sentinel: %s after %v: %s\n%s", what, timeout, problem, s.logTails())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkReplicas returns what is still wrong with the replicas' links to the
// master, or "" when every replica is in sync.
func (s *SentinelInstance) checkReplicas() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, r := range s.Replicas {
		cl := quickClient(r.Addr)
		defer cl.Close()
		info, err := cl.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Sprintf("replica %s: INFO replication: %v", r.Addr, err)
		}
		if st := infoField(info, "master_link_status"); st != "up" {
			return fmt.Sprintf("replica %s: master_link_status:%s", r.Addr, st)
		}
	}
	return ""
}

// checkSentinels returns what is still missing before a failover can work, or
// "" when every sentinel reports the master and knows the other sentinels and
// the replicas, all of them up.
func (s *SentinelInstance) checkSentinels() string {
	if problem := s.checkReplicas(); problem != "" {
		return problem
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	name := s.MasterName
	for _, sn := range s.Sentinels {
		addr, err := masterAddrByName(ctx, sn.Addr, name)
		if err != nil {
			return fmt.Sprintf("sentinel %s: get-master-addr-by-name %s: %v", sn.Addr, name, err)
		}
		if addr != s.Master.Addr {
			return fmt.Sprintf("sentinel %s: master %s is at %s, want %s", sn.Addr, name, addr, s.Master.Addr)
		}

		cl := quickSentinelClient(sn.Addr)
		defer cl.Close()
		m, err := cl.Master(ctx, name).Result()
		if err != nil {
			return fmt.Sprintf("sentinel %s: SENTINEL master %s: %v", sn.Addr, name, err)
		}
		if hasFlag(m["flags"], "s_down", "o_down", "disconnected") {
			return fmt.Sprintf("sentinel %s: master flags %s", sn.Addr, m["flags"])
		}

		others, err := cl.Sentinels(ctx, name).Result()
		if err != nil {
			return fmt.Sprintf("sentinel %s: SENTINEL sentinels %s: %v", sn.Addr, name, err)
		}
		if len(others) != len(s.Sentinels)-1 {
			return fmt.Sprintf("sentinel %s knows %d other sentinels, want %d", sn.Addr, len(others), len(s.Sentinels)-1)
		}
		for _, o := range others {
			a := net.JoinHostPort(o["ip"], o["port"])
			if !contains(s.SentinelAddrs, a) {
				return fmt.Sprintf("sentinel %s knows sentinel %s, which is not one of %v", sn.Addr, a, s.SentinelAddrs)
			}
			if hasFlag(o["flags"], "s_down", "o_down", "disconnected") {
				return fmt.Sprintf("sentinel %s: sentinel %s has flags %s", sn.Addr, a, o["flags"])
			}
		}

		replicas, err := cl.Replicas(ctx, name).Result()
		if err != nil {
			return fmt.Sprintf("sentinel %s: SENTINEL replicas %s: %v", sn.Addr, name, err)
		}
		if len(replicas) != len(s.Replicas) {
			return fmt.Sprintf("sentinel %s knows %d replicas, want %d", sn.Addr, len(replicas), len(s.Replicas))
		}
		for _, r := range replicas {
			a := net.JoinHostPort(r["ip"], r["port"])
			if s.nodeByAddr(a) == nil {
				return fmt.Sprintf("sentinel %s knows replica %s, which is not ours", sn.Addr, a)
			}
			if hasFlag(r["flags"], "s_down", "o_down", "disconnected") {
				return fmt.Sprintf("sentinel %s: replica %s has flags %s", sn.Addr, a, r["flags"])
			}
			if st := r["master-link-status"]; st != "ok" {
				return fmt.Sprintf("sentinel %s: replica %s has master-link-status %s", sn.Addr, a, st)
			}
		}
	}
	return ""
}

// masterAddrByName asks the sentinel at addr for the address of master name.
func masterAddrByName(ctx context.Context, addr, name string) (string, error) {
	cl := quickSentinelClient(addr)
	defer cl.Close()
	hp, err := cl.GetMasterAddrByName(ctx, name).Result()
	if err == redis.Nil {
		return "", fmt.Errorf("no master named %q", name)
	}
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("unexpected reply %q", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// quickSentinelClient is a sentinel client for a single check: short
// timeouts, no retries.
func quickSentinelClient(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		MaxRetries:   -1,
		PoolSize:     1,
	})
}

// hasFlag reports whether the comma-separated flags of SENTINEL master,
// replicas or sentinels contain any of want.
func hasFlag(flags string, want ...string) bool {
	for _, f := range strings.Split(flags, ",") {
		if contains(want, f) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// nodeByAddr finds the master or replica with address addr, or returns nil.
func (s *SentinelInstance) nodeByAddr(addr string) *Instance {
	if s.Master != nil && s.Master.Addr == addr {
		return s.Master
	}
	for _, r := range s.Replicas {
		if r.Addr == addr {
			return r
		}
	}
	return nil
}

// all returns every Instance of the setup: master, replicas, sentinels.
func (s *SentinelInstance) all() []*Instance {
	var all []*Instance
	if s.Master != nil {
		all = append(all, s.Master)
	}
	all = append(all, s.Replicas...)
	return append(all, s.Sentinels...)
}

// stopAll stops every process concurrently.
func (s *SentinelInstance) stopAll() {
	var wg sync.WaitGroup
	for _, n := range s.all() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.cleanup()
		}()
	}
	wg.Wait()
}

// logTails returns the end of every process's log, for failure messages.
func (s *SentinelInstance) logTails() string {
	var b strings.Builder
	for _, n := range s.all() {
		if tail := n.logTail(15); tail != "" {
			fmt.Fprintf(&b, "--- tail of %s (%s) ---\n%s\n", n.logPath, n.Addr, tail)
		}
	}
	return b.String()
}

// Client returns a go-redis failover client (redis.NewFailoverClient) for
// the master named MasterName, using SentinelAddrs, closed in t.Cleanup. It
// follows the master through failovers: it asks a sentinel for the master's
// address whenever it opens a connection, and drops its connections to the
// old master when a sentinel announces a new one.
func (s *SentinelInstance) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            s.MasterName,
		SentinelAddrs:         s.SentinelAddrs,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CurrentMaster returns the address (host:port) of the master as reported by
// SENTINEL get-master-addr-by-name on the first sentinel that answers
// (sentinels that are killed or paused are not asked). During a failover,
// sentinels may briefly disagree. It fails the test if no sentinel answers or
// the sentinels do not know the master.
func (s *SentinelInstance) CurrentMaster(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var problems []string
	for _, sn := range s.Sentinels {
		if !sn.answering() {
			continue
		}
		addr, err := masterAddrByName(ctx, sn.Addr, s.MasterName)
		if err == nil {
			return addr
		}
		problems = append(problems, fmt.Sprintf("%s: %v", sn.Addr, err))
	}
	if len(problems) == 0 {
		problems = append(problems, "no sentinel is running")
	}
	t.Fatalf("redistest: CurrentMaster(%s): %s", s.MasterName, strings.Join(problems, "; "))
	return ""
}
