package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	clusterSlots        = 16384
	clusterReadyTimeout = 30 * time.Second
	clusterCreateLimit  = 60 * time.Second
)

// ClusterOption configures Cluster.
type ClusterOption func(*clusterConfig)

type clusterConfig struct {
	masters  int
	replicas int
	args     []string
}

// Replicas sets the number of replicas per master (default 0). With the
// default three masters, Replicas(1) starts six nodes.
func Replicas(n int) ClusterOption {
	return func(c *clusterConfig) { c.replicas = n }
}

// Masters sets the number of masters (default 3, the minimum that
// redis-cli --cluster create accepts).
func Masters(n int) ClusterOption {
	return func(c *clusterConfig) { c.masters = n }
}

// NodeArgs appends extra command-line arguments to every node's redis-server,
// after the defaults.
func NodeArgs(args ...string) ClusterOption {
	return func(c *clusterConfig) { c.args = append(c.args, args...) }
}

// ClusterInstance is a Redis Cluster, either started by Cluster or external
// (given by REDIS_CLUSTER_ADDRS).
//
// Its methods report failures to the testing.TB it was created with, so call
// them from that test's goroutine.
type ClusterInstance struct {
	// Addrs are the nodes' addresses, host:port, in the order of Nodes.
	Addrs []string
	// Nodes are the cluster's nodes. redis-cli chooses which of them start
	// as masters, and roles change on failover; use MasterFor to find the
	// node that serves a key.
	Nodes []*Instance
	// External is true when the cluster was not started by this package.
	External bool

	t testing.TB
}

// Cluster starts a Redis Cluster on 127.0.0.1 and returns once it is healthy:
// every node reports cluster_state:ok and knows every other node, every
// replica's link to its master is up, and a go-redis ClusterClient can PING
// every shard and SET, GET and DEL a key in every slot range. By default it
// has three masters and no replicas; see Masters and Replicas.
//
// Each node is a redis-server with its own temporary directory, started with
// --cluster-enabled yes --cluster-node-timeout 2000 --save "" --appendonly no
// --repl-diskless-sync-delay 0, on a port P such that P+10000 (the cluster
// bus) was free as well. The nodes are joined with
// "redis-cli --cluster create ... --cluster-yes" and stopped in t.Cleanup.
//
// If REDIS_CLUSTER_ADDRS is set (comma-separated host:port), Cluster starts
// nothing and returns an external ClusterInstance once those nodes report
// cluster_state:ok. An external cluster is not flushed: tests that may run
// against one must use unique key prefixes.
//
// When redis-server or redis-cli is not installed, Cluster skips the test (or
// fails it when CI=true); see Require.
func Cluster(t testing.TB, opts ...ClusterOption) *ClusterInstance {
	t.Helper()
	cfg := clusterConfig{masters: 3}
	for _, o := range opts {
		o(&cfg)
	}
	if env := os.Getenv(envClusterAddrs); env != "" {
		return externalCluster(t, env)
	}
	if cfg.masters < 3 {
		t.Fatalf("redistest: Cluster needs at least 3 masters, got %d", cfg.masters)
	}
	if cfg.replicas < 0 {
		t.Fatalf("redistest: Cluster: negative replica count %d", cfg.replicas)
	}
	requireBinaries(t, envClusterAddrs, serverBin, cliBin)

	c := &ClusterInstance{t: t}
	n := cfg.masters * (1 + cfg.replicas)
	for k := 0; k < n; k++ {
		node := startInstance(t, true, func(port int, dir string) []string {
			p := strconv.Itoa(port)
			args := []string{
				"--port", p,
				"--bind", "127.0.0.1",
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes-" + p + ".conf",
				"--cluster-node-timeout", "2000",
				"--save", "",
				"--appendonly", "no",
				// Replicas sync at once instead of after 5 s.
				"--repl-diskless-sync-delay", "0",
				"--dir", dir,
			}
			return append(args, cfg.args...)
		})
		c.Nodes = append(c.Nodes, node)
		c.Addrs = append(c.Addrs, node.Addr)
	}
	// Runs before the nodes' own cleanups (which then have nothing to do)
	// and stops all nodes at once rather than one after another.
	t.Cleanup(c.stopAll)

	c.create(cfg.replicas)
	c.waitHealthy(n, cfg.masters, true, clusterReadyTimeout)
	return c
}

func externalCluster(t testing.TB, env string) *ClusterInstance {
	t.Helper()
	c := &ClusterInstance{External: true, t: t}
	for _, a := range strings.Split(env, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		c.Nodes = append(c.Nodes, externalInstance(t, a, envClusterAddrs))
		c.Addrs = append(c.Addrs, a)
	}
	if len(c.Nodes) == 0 {
		t.Fatalf("redistest: %s=%q names no address", envClusterAddrs, env)
	}
	// Nothing is written to an external cluster: just check it is up.
	c.waitHealthy(0, 0, false, readyTimeout)
	return c
}

// create joins the started nodes into a cluster with redis-cli.
func (c *ClusterInstance) create(replicas int) {
	c.t.Helper()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBin, args...)
	cmd.SysProcAttr = sysProcAttr()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "All 16384 slots covered") {
		c.t.Fatalf("redistest: %s %s failed: %v\n%s\n%s",
			cliBin, strings.Join(args, " "), err, out, c.logTails())
	}
}

// waitHealthy waits until checkHealthy passes, or fails the test.
func (c *ClusterInstance) waitHealthy(nodes, masters int, write bool, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		problem := c.checkHealthy(nodes, masters, write)
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: cluster %v not healthy after %v: %s\n%s",
				c.Addrs, timeout, problem, c.logTails())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkHealthy returns what is still wrong with the cluster, or "" when it is
// ready for tests. nodes and masters, when not zero, are the expected numbers
// of known nodes and masters.
func (c *ClusterInstance) checkHealthy(nodes, masters int, write bool) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seenMasters := 0
	for _, addr := range c.Addrs {
		cl := quickClient(addr)
		defer cl.Close()
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER INFO: %v", addr, err)
		}
		if s := infoField(info, "cluster_state"); s != "ok" {
			return fmt.Sprintf("%s: cluster_state:%s", addr, s)
		}
		if s := infoField(info, "cluster_slots_ok"); s != strconv.Itoa(clusterSlots) {
			return fmt.Sprintf("%s: cluster_slots_ok:%s", addr, s)
		}
		if nodes > 0 {
			if s := infoField(info, "cluster_known_nodes"); s != strconv.Itoa(nodes) {
				return fmt.Sprintf("%s: cluster_known_nodes:%s, want %d", addr, s, nodes)
			}
		}
		repl, err := cl.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Sprintf("%s: INFO replication: %v", addr, err)
		}
		switch role := infoField(repl, "role"); role {
		case "master":
			seenMasters++
		case "slave":
			if s := infoField(repl, "master_link_status"); s != "up" {
				return fmt.Sprintf("%s: replica's master_link_status:%s", addr, s)
			}
		default:
			return fmt.Sprintf("%s: role:%s", addr, role)
		}
	}
	if masters > 0 && seenMasters != masters {
		return fmt.Sprintf("%d masters, want %d", seenMasters, masters)
	}

	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
	})
	defer cc.Close()
	err := cc.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		return shard.Ping(ctx).Err()
	})
	if err != nil {
		return fmt.Sprintf("ClusterClient PING on every shard: %v", err)
	}
	if !write {
		return ""
	}
	ranges, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return fmt.Sprintf("ClusterClient CLUSTER SLOTS: %v", err)
	}
	covered := 0
	for _, r := range ranges {
		covered += r.End - r.Start + 1
		key := keyInSlots(r.Start, r.End)
		if err := cc.Set(ctx, key, "ok", 0).Err(); err != nil {
			return fmt.Sprintf("ClusterClient SET %s: %v", key, err)
		}
		if v, err := cc.Get(ctx, key).Result(); err != nil || v != "ok" {
			return fmt.Sprintf("ClusterClient GET %s = %q, %v", key, v, err)
		}
		if err := cc.Del(ctx, key).Err(); err != nil {
			return fmt.Sprintf("ClusterClient DEL %s: %v", key, err)
		}
	}
	if covered != clusterSlots {
		return fmt.Sprintf("CLUSTER SLOTS covers %d slots", covered)
	}
	return ""
}

// stopAll stops every node concurrently.
func (c *ClusterInstance) stopAll() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.cleanup()
		}()
	}
	wg.Wait()
}

// Client returns a go-redis ClusterClient for the cluster, closed in
// t.Cleanup.
func (c *ClusterInstance) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// MasterFor returns the node that currently serves the hash slot of key, as
// reported by CLUSTER KEYSLOT and CLUSTER SLOTS on the first node that
// answers (nodes that are killed or paused are not asked). It fails the test
// if no node answers or the slot is not served.
func (c *ClusterInstance) MasterFor(key string) *Instance {
	c.t.Helper()
	var problems []string
	for _, n := range c.Nodes {
		if !n.answering() {
			continue
		}
		addr, err := masterAddrFor(n.Addr, key)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", n.Addr, err))
			continue
		}
		if m := c.nodeByAddr(addr); m != nil {
			return m
		}
		problems = append(problems, fmt.Sprintf("%s: master %s is not a node of this cluster", n.Addr, addr))
	}
	if len(problems) == 0 {
		problems = append(problems, "no node is running")
	}
	c.t.Fatalf("redistest: MasterFor(%q): %s", key, strings.Join(problems, "; "))
	return nil
}

// masterAddrFor asks the node at addr which master serves key's slot.
func masterAddrFor(addr, key string) (string, error) {
	cl := quickClient(addr)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", fmt.Errorf("CLUSTER KEYSLOT: %w", err)
	}
	ranges, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil
		}
	}
	return "", fmt.Errorf("slot %d is not served", slot)
}

// nodeByAddr finds the node with address addr. For an external cluster a node
// that was not listed in REDIS_CLUSTER_ADDRS is returned as a new external
// Instance.
func (c *ClusterInstance) nodeByAddr(addr string) *Instance {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	if !c.External {
		return nil
	}
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	port, _ := strconv.Atoi(portStr)
	return &Instance{Addr: addr, Port: port, External: true, t: c.t}
}

// logTails returns the end of every node's log, for failure messages.
func (c *ClusterInstance) logTails() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		if tail := n.logTail(15); tail != "" {
			fmt.Fprintf(&b, "--- tail of %s (%s) ---\n%s\n", n.logPath, n.Addr, tail)
		}
	}
	return b.String()
}

// keyInSlots returns a key whose hash slot lies in [start, end].
func keyInSlots(start, end int) string {
	for n := 0; ; n++ {
		key := "redistest:ready:" + strconv.Itoa(n)
		if s := keySlot(key); start <= s && s <= end {
			return key
		}
	}
}

// keySlot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of the key, or
// of its hash tag (the part between the first "{" and the next "}", if not
// empty), modulo 16384.
func keySlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}
