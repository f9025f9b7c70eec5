//go:build unix

package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// pidSet collects the PIDs of the processes that subtests started, to check
// after the subtests (and so their cleanups) have finished.
type pidSet struct {
	mu   sync.Mutex
	pids []int
}

func (s *pidSet) add(i *Instance) {
	if i.External {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pids = append(s.pids, i.PID())
}

// assertDead fails t if any recorded process is still alive.
func (s *pidSet) assertDead(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pid := range s.pids {
		if alive(pid) {
			t.Errorf("redis-server pid %d is still alive after cleanup", pid)
		}
	}
}

// alive reports whether pid is a live process. A zombie (which happens to an
// orphan where PID 1 does not reap) counts as dead.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return false
		}
	}
	return true
}

func skipIfExternal(t *testing.T, i *Instance) {
	t.Helper()
	if i.External {
		t.Skip("REDIS_ADDR is set: this test needs servers it starts itself")
	}
}

func TestServer(t *testing.T) {
	var pids pidSet
	ctx := context.Background()

	t.Run("lifecycle", func(t *testing.T) {
		srv := Server(t)
		skipIfExternal(t, srv)
		pids.add(srv)
		if pgid, err := syscall.Getpgid(srv.PID()); err != nil || pgid != srv.PID() {
			t.Errorf("process group of pid %d = %d, %v; want its own group", srv.PID(), pgid, err)
		}
		if !strings.HasPrefix(srv.Addr, "127.0.0.1:") || srv.Addr != net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port)) {
			t.Errorf("Addr = %q, Port = %d", srv.Addr, srv.Port)
		}

		c := srv.Client(t)
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING: %v", err)
		}
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
			t.Fatalf("GET = %q, %v; want v", v, err)
		}
		if v, err := c.ConfigGet(ctx, "save").Result(); err != nil || v["save"] != "" {
			t.Errorf("CONFIG GET save = %v, %v; want empty", v, err)
		}
		if v, err := c.ConfigGet(ctx, "appendonly").Result(); err != nil || v["appendonly"] != "no" {
			t.Errorf("CONFIG GET appendonly = %v, %v; want no", v, err)
		}

		// Paused: a command times out.
		srv.Pause()
		slow := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
		defer slow.Close()
		start := time.Now()
		err := slow.Get(ctx, "k").Err()
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("GET on a paused server: err = %v; want a timeout", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("GET on a paused server took %v; want about 200ms", d)
		}

		// Resumed: works again.
		srv.Resume()
		if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
			t.Fatalf("GET after Resume = %q, %v; want v", v, err)
		}

		// Killed: connection refused.
		oldPID := srv.PID()
		srv.Kill()
		if alive(oldPID) {
			t.Errorf("pid %d alive after Kill", oldPID)
		}
		fresh := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		defer fresh.Close()
		if err := fresh.Ping(ctx).Err(); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("PING after Kill: err = %v; want connection refused", err)
		}
		srv.Kill() // a second Kill does nothing

		// Restarted: same port, new process, empty.
		srv.Restart()
		pids.add(srv)
		if srv.PID() == oldPID {
			t.Errorf("PID after Restart = %d, same as before", srv.PID())
		}
		c2 := srv.Client(t)
		if err := c2.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after Restart: %v", err)
		}
		if err := c2.Get(ctx, "k").Err(); err != redis.Nil {
			t.Errorf("GET k after Restart: err = %v; want redis.Nil (data gone)", err)
		}
		if err := c2.Set(ctx, "k2", "v2", 0).Err(); err != nil {
			t.Errorf("SET after Restart: %v", err)
		}
	})

	t.Run("cleanup of a paused server", func(t *testing.T) {
		srv := Server(t)
		skipIfExternal(t, srv)
		pids.add(srv)
		srv.Pause()
	})

	t.Run("cleanup of a killed server", func(t *testing.T) {
		srv := Server(t)
		skipIfExternal(t, srv)
		pids.add(srv)
		srv.Kill()
	})

	t.Run("restart of a running server", func(t *testing.T) {
		srv := Server(t)
		skipIfExternal(t, srv)
		pids.add(srv)
		srv.Restart()
		pids.add(srv)
		if err := srv.Client(t).Ping(ctx).Err(); err != nil {
			t.Fatalf("PING: %v", err)
		}
	})

	t.Run("args", func(t *testing.T) {
		srv := Server(t, Args("--maxmemory", "12mb"))
		skipIfExternal(t, srv)
		pids.add(srv)
		v, err := srv.Client(t).ConfigGet(ctx, "maxmemory").Result()
		if err != nil || v["maxmemory"] != strconv.Itoa(12<<20) {
			t.Errorf("CONFIG GET maxmemory = %v, %v; want %d", v, err, 12<<20)
		}
	})

	t.Run("parallel", func(t *testing.T) {
		for k := 0; k < 4; k++ {
			t.Run(strconv.Itoa(k), func(t *testing.T) {
				t.Parallel()
				srv := Server(t)
				pids.add(srv)
				key := fmt.Sprintf("redistest:parallel:%d", k)
				c := srv.Client(t)
				if err := c.Set(ctx, key, "x", 0).Err(); err != nil {
					t.Fatalf("SET: %v", err)
				}
				if v, err := c.Get(ctx, key).Result(); err != nil || v != "x" {
					t.Fatalf("GET = %q, %v", v, err)
				}
			})
		}
	})

	pids.assertDead(t)
}

// TestPortTaken checks that a start that fails because the chosen port was
// taken before redis-server bound it is retried on another port.
func TestPortTaken(t *testing.T) {
	if os.Getenv(envAddr) != "" {
		t.Skip("REDIS_ADDR is set")
	}
	Require(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	var pids pidSet
	calls := 0
	t.Run("start", func(t *testing.T) {
		srv := startInstance(t, false, func(port int, dir string) []string {
			calls++
			if calls == 1 {
				port = taken // as if another process took the port meanwhile
			}
			return []string{"--save", "", "--appendonly", "no",
				"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir}
		})
		pids.add(srv)
		if calls != 2 {
			t.Errorf("%d attempts; want 2", calls)
		}
		if err := srv.Client(t).Ping(context.Background()).Err(); err != nil {
			t.Errorf("PING: %v", err)
		}
	})
	pids.assertDead(t)
}

// TestExternal checks REDIS_ADDR: nothing is started and signal methods skip.
func TestExternal(t *testing.T) {
	var pids pidSet
	srv := Server(t)
	skipIfExternal(t, srv)
	pids.add(srv)

	t.Setenv(envAddr, srv.Addr)
	ext := Server(t)
	if !ext.External || ext.Addr != srv.Addr || ext.Port != srv.Port || ext.PID() != 0 {
		t.Fatalf("external Instance = {Addr %q, Port %d, External %v, PID %d}; want %s, external, PID 0",
			ext.Addr, ext.Port, ext.External, ext.PID(), srv.Addr)
	}
	if err := ext.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING external: %v", err)
	}

	for _, m := range []struct {
		name string
		call func(*Instance)
	}{
		{"Pause", (*Instance).Pause},
		{"Resume", (*Instance).Resume},
		{"Kill", (*Instance).Kill},
		{"Restart", (*Instance).Restart},
	} {
		var sub *testing.T
		t.Run(m.name, func(t *testing.T) {
			sub = t
			m.call(Server(t))
			t.Errorf("%s on an external server did not skip", m.name)
		})
		if !sub.Skipped() {
			t.Errorf("%s on an external server: test not skipped", m.name)
		}
	}
	if !alive(srv.PID()) {
		t.Errorf("the real server (pid %d) was signalled through the external Instance", srv.PID())
	}

	t.Setenv(envAddr, "127.0.0.1:notaport")
	t.Run("bad address", func(t *testing.T) {
		tb := &fakeTB{TB: t}
		runTB(func() { Server(tb) })
		if !strings.Contains(tb.fatal, "REDIS_ADDR") {
			t.Errorf("Server with a bad REDIS_ADDR: fatal = %q; want it to name REDIS_ADDR", tb.fatal)
		}
	})
}

// fakeTB records Skip and Fatal instead of acting on them.
type fakeTB struct {
	testing.TB
	skip, fatal string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any) {
	f.skip = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Skipf(format string, args ...any) {
	f.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runTB runs f on its own goroutine, which fakeTB may end with Goexit.
func runTB(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func TestRequire(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(envUnit, "") // the missing-binary path, not make test-unit's skip
	t.Setenv(envAddr, "")
	t.Setenv(envClusterAddrs, "")
	t.Setenv(envSentinelAddrs, "")
	var out bytes.Buffer
	oldOut := warnOut
	warnOut = &out
	warnOnce = sync.Once{}
	t.Cleanup(func() { warnOut = oldOut })

	t.Setenv("CI", "")
	tb := &fakeTB{TB: t}
	runTB(func() { Require(tb) })
	if !strings.HasPrefix(tb.skip, "REDIS NOT INSTALLED") ||
		!strings.Contains(tb.skip, "apt-get install -y redis-server") || tb.fatal != "" {
		t.Errorf("Require without redis-server, CI unset: skip %q, fatal %q", tb.skip, tb.fatal)
	}

	tb = &fakeTB{TB: t}
	runTB(func() { Cluster(tb) })
	if !strings.Contains(tb.skip, "redis-server and redis-cli") || tb.fatal != "" {
		t.Errorf("Cluster without binaries: skip %q, fatal %q", tb.skip, tb.fatal)
	}

	tb = &fakeTB{TB: t}
	runTB(func() { Sentinel(tb) })
	if !strings.HasPrefix(tb.skip, "REDIS NOT INSTALLED") || !strings.Contains(tb.skip, envSentinelAddrs) || tb.fatal != "" {
		t.Errorf("Sentinel without redis-server: skip %q, fatal %q", tb.skip, tb.fatal)
	}

	t.Setenv("CI", "true")
	tb = &fakeTB{TB: t}
	runTB(func() { Server(tb) })
	if !strings.Contains(tb.fatal, "REDIS NOT INSTALLED") ||
		!strings.Contains(tb.fatal, "CI must have redis-server installed") || tb.skip != "" {
		t.Errorf("Server without redis-server, CI=true: skip %q, fatal %q", tb.skip, tb.fatal)
	}

	tb = &fakeTB{TB: t}
	runTB(func() { Sentinel(tb) })
	if !strings.Contains(tb.fatal, "REDIS NOT INSTALLED") ||
		!strings.Contains(tb.fatal, "CI must have redis-server installed") || tb.skip != "" {
		t.Errorf("Sentinel without redis-server, CI=true: skip %q, fatal %q", tb.skip, tb.fatal)
	}

	if n := strings.Count(out.String(), "REDIS NOT INSTALLED"); n != 1 {
		t.Errorf("warning printed %d times; want once:\n%s", n, out.String())
	}

	// With REDIS_ADDR set, no binary is needed.
	t.Setenv(envAddr, "127.0.0.1:1")
	tb = &fakeTB{TB: t}
	runTB(func() { Require(tb) })
	if tb.skip != "" || tb.fatal != "" {
		t.Errorf("Require with REDIS_ADDR set: skip %q, fatal %q", tb.skip, tb.fatal)
	}
}

func TestCluster(t *testing.T) {
	var pids pidSet
	ctx := context.Background()

	t.Run("3 masters", func(t *testing.T) {
		c := Cluster(t)
		if c.External {
			t.Skip("REDIS_CLUSTER_ADDRS is set: this test needs a cluster it starts itself")
		}
		for _, n := range c.Nodes {
			pids.add(n)
		}
		if len(c.Nodes) != 3 || len(c.Addrs) != 3 {
			t.Fatalf("%d nodes, %d addrs; want 3", len(c.Nodes), len(c.Addrs))
		}

		cc := c.Client(t)
		keys := make([]string, 100)
		for k := range keys {
			keys[k] = fmt.Sprintf("redistest:test:%d", k)
			if err := cc.Set(ctx, keys[k], "v"+strconv.Itoa(k), 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", keys[k], err)
			}
		}
		nodeClients := map[*Instance]*redis.Client{}
		masters := map[*Instance]int{}
		for k, key := range keys {
			want := "v" + strconv.Itoa(k)
			if v, err := cc.Get(ctx, key).Result(); err != nil || v != want {
				t.Fatalf("ClusterClient GET %s = %q, %v; want %q", key, v, err, want)
			}
			if slot, err := cc.ClusterKeySlot(ctx, key).Result(); err != nil || int(slot) != keySlot(key) {
				t.Errorf("CLUSTER KEYSLOT %s = %d, %v; keySlot = %d", key, slot, err, keySlot(key))
			}
			m := c.MasterFor(key)
			masters[m]++
			nc := nodeClients[m]
			if nc == nil {
				nc = m.Client(t)
				nodeClients[m] = nc
			}
			if v, err := nc.Get(ctx, key).Result(); err != nil || v != want {
				t.Errorf("GET %s on MasterFor's node %s = %q, %v; want %q", key, m.Addr, v, err, want)
			}
		}
		if len(masters) != 3 {
			t.Errorf("100 keys landed on %d masters; want 3", len(masters))
		}

		// REDIS_CLUSTER_ADDRS: the same cluster, as an external one.
		t.Setenv(envClusterAddrs, strings.Join(c.Addrs, ","))
		ext := Cluster(t)
		if !ext.External || len(ext.Nodes) != 3 || !ext.Nodes[0].External {
			t.Fatalf("external cluster = %+v", ext)
		}
		m := ext.MasterFor(keys[0])
		if m.Addr != c.MasterFor(keys[0]).Addr {
			t.Errorf("external MasterFor = %s; want %s", m.Addr, c.MasterFor(keys[0]).Addr)
		}
		if v, err := ext.Client(t).Get(ctx, keys[0]).Result(); err != nil || v != "v0" {
			t.Errorf("external ClusterClient GET = %q, %v", v, err)
		}
	})

	t.Run("replicas and failover", func(t *testing.T) {
		if testing.Short() {
			t.Skip("-short")
		}
		c := Cluster(t, Replicas(1))
		if c.External {
			t.Skip("REDIS_CLUSTER_ADDRS is set")
		}
		for _, n := range c.Nodes {
			pids.add(n)
		}
		if len(c.Nodes) != 6 {
			t.Fatalf("%d nodes; want 6", len(c.Nodes))
		}
		cc := c.Client(t)
		const key = "redistest:failover"
		if err := cc.Set(ctx, key, "before", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		// Wait for the write to reach the replica before killing its master.
		old := c.MasterFor(key)
		if err := old.Client(t).Do(ctx, "WAIT", 1, 2000).Err(); err != nil {
			t.Fatalf("WAIT: %v", err)
		}
		old.Kill()

		deadline := time.Now().Add(10 * time.Second)
		for {
			if m := c.MasterFor(key); m != old {
				if v, err := m.Client(t).Get(ctx, key).Result(); err != nil || v != "before" {
					t.Fatalf("GET on the promoted master %s = %q, %v", m.Addr, v, err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no replica promoted 10s after killing %s", old.Addr)
			}
			time.Sleep(100 * time.Millisecond)
		}

		// The old master comes back, as a replica of the new one.
		old.Restart()
		pids.add(old)
		if err := old.Client(t).Ping(ctx).Err(); err != nil {
			t.Fatalf("PING restarted node: %v", err)
		}
	})

	pids.assertDead(t)
}

// TestOrphan checks that a redis-server does not outlive a test binary that
// is killed (Pdeathsig). The test binary runs itself as the helper.
func TestOrphan(t *testing.T) {
	if os.Getenv("REDISTEST_ORPHAN_HELPER") == "1" {
		srv := Server(t)
		fmt.Printf("REDISTEST_PID=%d\n", srv.PID())
		time.Sleep(20 * time.Second) // killed by the parent long before
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("parent-death signal is Linux only")
	}
	if os.Getenv(envAddr) != "" {
		t.Skip("REDIS_ADDR is set")
	}
	Require(t)

	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphan$", "-test.count=1", "-test.timeout=30s")
	cmd.Env = append(os.Environ(), "REDISTEST_ORPHAN_HELPER=1", "TMPDIR="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pidc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "REDISTEST_PID="); ok {
				pid, _ := strconv.Atoi(s)
				pidc <- pid
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var pid int
	select {
	case pid = <-pidc:
	case <-time.After(15 * time.Second):
		t.Fatalf("helper did not report a PID; stderr:\n%s", stderr.String())
	}
	if !alive(pid) {
		t.Fatalf("helper's redis-server pid %d not alive", pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server pid %d outlived its killed test binary", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
