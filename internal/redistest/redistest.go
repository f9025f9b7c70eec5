package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	envAddr         = "REDIS_ADDR"
	envClusterAddrs = "REDIS_CLUSTER_ADDRS"

	serverBin = "redis-server"
	cliBin    = "redis-cli"

	readyTimeout  = 10 * time.Second // a started server must answer within this
	termGrace     = 2 * time.Second  // SIGTERM to SIGKILL
	killWait      = 10 * time.Second // how long to wait for a SIGKILLed process
	startAttempts = 5                // ports tried when the chosen one was taken
	logTailLines  = 40
)

// errAddrInUse marks a start that failed because the port was taken between
// choosing it and redis-server binding it.
var errAddrInUse = errors.New("address already in use")

// Option configures Server.
type Option func(*serverConfig)

type serverConfig struct {
	args []string
}

// Args appends extra command-line arguments to redis-server, after the
// defaults, for example Args("--maxmemory", "10mb"). Later arguments override
// earlier ones. Args has no effect on an external server (REDIS_ADDR).
func Args(args ...string) Option {
	return func(c *serverConfig) { c.args = append(c.args, args...) }
}

// Instance is one redis-server, either started by Server, Cluster or
// Sentinel, or external (given by REDIS_ADDR, REDIS_CLUSTER_ADDRS or
// REDIS_SENTINEL_ADDRS). The sentinels of a Sentinel setup are Instances too:
// redis-server processes in sentinel mode.
//
// Its methods report failures to the testing.TB it was created with, so call
// them from that test's goroutine. They are safe to call concurrently with
// each other and with cleanup.
type Instance struct {
	// Addr is the server's address, host:port (127.0.0.1:port when started).
	Addr string
	// Port is the server's TCP port. It does not change across Restart.
	Port int
	// External is true when the server was not started by this package, in
	// which case Pause, Resume, Kill and Restart skip the test.
	External bool

	t       testing.TB
	dir     string
	logPath string

	mu      sync.Mutex
	ports   []int    // reserved in this test binary; released in cleanup
	args    []string // redis-server arguments, reused by Restart
	p       *process // nil when no process is running
	paused  bool
	lastPID int
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // the result of cmd.Wait, readable after done
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Server starts a redis-server on a free port of 127.0.0.1 and returns once it
// answers. The server runs with --save "" --appendonly no, in a directory
// under t.TempDir(), plus any arguments given with Args. It is stopped in
// t.Cleanup: SIGCONT if paused, then SIGTERM, then SIGKILL after about two
// seconds.
//
// If REDIS_ADDR is set, Server starts nothing and returns an external Instance
// for that address once it answers PING. An external server is not flushed:
// tests that may run against one must use unique key prefixes.
//
// When redis-server is not installed, Server skips the test (or fails it when
// CI=true); see Require.
func Server(t testing.TB, opts ...Option) *Instance {
	t.Helper()
	var cfg serverConfig
	for _, o := range opts {
		o(&cfg)
	}
	if addr := os.Getenv(envAddr); addr != "" {
		return externalInstance(t, addr, envAddr)
	}
	Require(t)
	return startInstance(t, false, func(port int, dir string) []string {
		args := []string{
			"--save", "",
			"--appendonly", "no",
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--dir", dir,
		}
		return append(args, cfg.args...)
	})
}

// externalInstance returns an Instance for a server that the test did not
// start, once it answers PING.
func externalInstance(t testing.TB, addr, env string) *Instance {
	t.Helper()
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("redistest: %s: bad address %q: %v", env, addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatalf("redistest: %s: bad port in %q: %v", env, addr, err)
	}
	if err := waitReady(addr, nil, readyTimeout); err != nil {
		t.Fatalf("redistest: %s=%s is set, but that server does not answer: %v", env, os.Getenv(env), err)
	}
	return &Instance{Addr: addr, Port: port, External: true, t: t}
}

// startInstance starts a redis-server with the arguments that argsFor builds
// for a port and directory, trying other ports if the chosen one is taken by
// the time redis-server binds it. With cluster set, port+10000 (the cluster
// bus) must be free as well.
func startInstance(t testing.TB, cluster bool, argsFor func(port int, dir string) []string) *Instance {
	t.Helper()
	dir := t.TempDir()
	i := &Instance{t: t, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	// Registered after TempDir's own cleanup, so it runs before the directory
	// is removed.
	t.Cleanup(i.cleanup)

	i.mu.Lock()
	defer i.mu.Unlock()
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		ports, err := reservePorts(cluster)
		if err != nil {
			t.Fatalf("redistest: choosing a port: %v", err)
		}
		// Ports that failed stay reserved (someone else holds them) until
		// cleanup.
		i.ports = append(i.ports, ports...)
		i.Port = ports[0]
		i.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		i.args = argsFor(ports[0], dir)
		if lastErr = i.startLocked(); lastErr == nil {
			return i
		}
		if !errors.Is(lastErr, errAddrInUse) {
			break
		}
	}
	t.Fatalf("redistest: starting redis-server: %v", lastErr)
	return nil
}

// startLocked starts redis-server with i.args and waits until it answers.
// On failure the process is killed and the error carries the log's tail.
func (i *Instance) startLocked() error {
	f, err := os.OpenFile(i.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== redistest: %s %s\n", serverBin, strings.Join(quoteArgs(i.args), " "))
	offset, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return err
	}
	cmd := exec.Command(serverBin, i.args...)
	cmd.Dir = i.dir
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	// The child has its own copy of the descriptor.
	f.Close()
	if err != nil {
		return fmt.Errorf("starting %s: %w", serverBin, err)
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	i.p = p
	i.paused = false
	i.lastPID = p.pid

	if err := waitReady(i.Addr, p, readyTimeout); err != nil {
		i.stopLocked(false)
		tail := readTail(i.logPath, offset, logTailLines)
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return fmt.Errorf("%w\n--- tail of %s ---\n%s", err, i.logPath, tail)
	}
	return nil
}

// waitReady waits until the server at addr answers. When p is not nil the
// server must report p's PID in INFO, so that a server of another test binary
// that took the port is not mistaken for ours; waitReady also gives up as soon
// as p exits.
func waitReady(addr string, p *process, timeout time.Duration) error {
	var done <-chan struct{} // nil (never ready) for an external server
	if p != nil {
		done = p.done
	}
	deadline := time.Now().Add(timeout)
	for {
		if p != nil && p.exited() {
			return fmt.Errorf("redis-server (pid %d) exited during startup: %v", p.pid, p.err)
		}
		err := checkReady(addr, p)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v", addr, timeout, err)
		}
		select {
		case <-done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkReady makes one readiness check. It uses a new client each time: a
// go-redis pool remembers a failed dial for a second.
func checkReady(addr string, p *process) error {
	c := quickClient(addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if p == nil {
		return c.Ping(ctx).Err()
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	if pid := infoField(info, "process_id"); pid != strconv.Itoa(p.pid) {
		return fmt.Errorf("%s is answered by another redis-server (pid %s, ours is %d)", addr, pid, p.pid)
	}
	return nil
}

// quickClient is a client for a single check: short timeouts, no retries.
func quickClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		MaxRetries:   -1,
		PoolSize:     1,
	})
}

// stopLocked stops the running process, if any, and waits for it. With
// graceful set it sends SIGCONT (if paused) and SIGTERM first, and SIGKILL only
// if the process has not exited within termGrace; it reports whether SIGKILL
// was needed then. Without graceful it sends SIGKILL straight away.
func (i *Instance) stopLocked(graceful bool) (forced bool, err error) {
	p := i.p
	if p == nil {
		return false, nil
	}
	wasPaused := i.paused
	i.p = nil
	i.paused = false
	if !p.exited() && graceful {
		if wasPaused {
			_ = continueProcess(p.cmd.Process)
		}
		_ = terminate(p.cmd.Process)
		select {
		case <-p.done:
		case <-time.After(termGrace):
			forced = true
		}
	}
	if !p.exited() {
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(killWait):
			err = fmt.Errorf("redis-server (pid %d) still running %v after SIGKILL", p.pid, killWait)
		}
	}
	killGroup(p.pid)
	return forced, err
}

// cleanup stops the process whatever its state and releases its ports. It may
// be called more than once.
func (i *Instance) cleanup() {
	i.mu.Lock()
	defer i.mu.Unlock()
	forced, err := i.stopLocked(true)
	if forced {
		i.t.Logf("redistest: redis-server on %s did not exit within %v of SIGTERM; sent SIGKILL", i.Addr, termGrace)
	}
	if err != nil {
		i.t.Errorf("redistest: %v", err)
	}
	releasePorts(i.ports)
	i.ports = nil
}

func (i *Instance) skipIfExternal(method string) {
	i.t.Helper()
	if i.External {
		i.t.Skipf("redistest: %s needs a redis-server started by the test, but %s is external "+
			"(%s, %s or %s is set) and a process we did not start cannot be signalled",
			method, i.Addr, envAddr, envClusterAddrs, envSentinelAddrs)
	}
}

// runningLocked returns the running process or fails the test.
func (i *Instance) runningLocked(method string) *process {
	i.t.Helper()
	if i.p == nil || i.p.exited() {
		i.t.Fatalf("redistest: %s: redis-server on %s is not running", method, i.Addr)
	}
	return i.p
}

// answering reports whether the server is expected to answer commands: it is
// external, or started, running and not paused.
func (i *Instance) answering() bool {
	if i.External {
		return true
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.p != nil && !i.p.exited() && !i.paused
}

// PID returns the process ID of the most recently started redis-server
// process of this Instance (which may have exited since, for example after
// Kill), or 0 for an external server.
func (i *Instance) PID() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.lastPID
}

// Pause stops the server with SIGSTOP, and returns once it has stopped:
// connections stay open but nothing is answered until Resume. It fails the
// test if the server is not running, and skips it if the server is external.
func (i *Instance) Pause() {
	i.t.Helper()
	i.skipIfExternal("Pause")
	if !signalsSupported {
		i.t.Skip("redistest: Pause needs SIGSTOP, which this platform lacks")
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	p := i.runningLocked("Pause")
	if err := stopProcess(p.cmd.Process); err != nil {
		i.t.Fatalf("redistest: Pause: SIGSTOP to pid %d: %v", p.pid, err)
	}
	if err := waitStopped(p.pid, 2*time.Second); err != nil {
		i.t.Fatalf("redistest: Pause: %v", err)
	}
	i.paused = true
}

// Resume continues a paused server with SIGCONT. It fails the test if the
// server is not running, and skips it if the server is external.
func (i *Instance) Resume() {
	i.t.Helper()
	i.skipIfExternal("Resume")
	if !signalsSupported {
		i.t.Skip("redistest: Resume needs SIGCONT, which this platform lacks")
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	p := i.runningLocked("Resume")
	if err := continueProcess(p.cmd.Process); err != nil {
		i.t.Fatalf("redistest: Resume: SIGCONT to pid %d: %v", p.pid, err)
	}
	i.paused = false
}

// Kill sends SIGKILL to the server and waits until it has exited, as in a
// crash: nothing is saved and clients see their connections reset. It does
// nothing if the server is not running, and skips the test if it is external.
// Use Restart to start it again.
func (i *Instance) Kill() {
	i.t.Helper()
	i.skipIfExternal("Kill")
	i.mu.Lock()
	defer i.mu.Unlock()
	if _, err := i.stopLocked(false); err != nil {
		i.t.Fatalf("redistest: Kill: %v", err)
	}
}

// Restart starts the server again on the same port, with the same arguments
// and directory, and returns once it answers. It is meant for use after Kill;
// a server that is still running is stopped first (SIGTERM, then SIGKILL). A
// plain server comes back empty; a cluster node comes back with its node
// configuration and rejoins its cluster. A sentinel comes back with the
// configuration it rewrote (its ID, the current master, the known replicas
// and sentinels), so it resumes monitoring where it stopped. The master or
// replica of a Sentinel setup comes back with its original arguments: a
// master restarted after a failover starts as a master, and the sentinels
// turn it into a replica of the new master about ten seconds later. Restart
// skips the test if the server is external, and fails it if the port cannot
// be bound again.
func (i *Instance) Restart() {
	i.t.Helper()
	i.skipIfExternal("Restart")
	i.mu.Lock()
	defer i.mu.Unlock()
	if _, err := i.stopLocked(true); err != nil {
		i.t.Fatalf("redistest: Restart: %v", err)
	}
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = i.startLocked(); err == nil {
			return
		}
		if !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	i.t.Fatalf("redistest: Restart of redis-server on %s: %v", i.Addr, err)
}

// Client returns a go-redis client for the server, closed in t.Cleanup. The
// client uses go-redis defaults; build your own from Addr to tune timeouts.
func (i *Instance) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: i.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var (
	portMu   sync.Mutex
	reserved = map[int]bool{} // ports handed out and not yet released
)

// reservePorts picks a free port of 127.0.0.1 (and, with bus set, checks that
// port+10000 is free too) that this test binary has not handed out already.
// Another process may still take it before redis-server binds it; callers
// retry on errAddrInUse.
func reservePorts(bus bool) ([]int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	var lastErr error
	for try := 0; try < 200; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		ports := []int{port}
		if bus {
			ports = append(ports, port+10000)
		}
		ok := true
		for _, p := range ports {
			if p > 65535 || reserved[p] {
				ok = false
			}
		}
		if ok && bus {
			l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
			if err != nil {
				ok, lastErr = false, err
			} else {
				l2.Close()
			}
		}
		l.Close()
		if ok {
			for _, p := range ports {
				reserved[p] = true
			}
			return ports, nil
		}
	}
	return nil, fmt.Errorf("no free port found (last error: %v)", lastErr)
}

func releasePorts(ports []int) {
	portMu.Lock()
	defer portMu.Unlock()
	for _, p := range ports {
		delete(reserved, p)
	}
}

// readTail returns the last n lines of the file at path from offset on.
func readTail(path string, offset int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return "(log is empty)"
	}
	return strings.Join(lines, "\n")
}

// logTail returns the last n lines of the instance's log, or "" for an
// external server.
func (i *Instance) logTail(n int) string {
	if i.External || i.logPath == "" {
		return ""
	}
	return readTail(i.logPath, 0, n)
}

// infoField returns the value of key in the output of INFO or CLUSTER INFO.
func infoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), key+":"); ok {
			return v
		}
	}
	return ""
}

func quoteArgs(args []string) []string {
	q := make([]string, len(args))
	for k, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		q[k] = a
	}
	return q
}

var (
	warnOnce sync.Once
	warnOut  io.Writer = os.Stderr // replaced in tests
)

// Require checks that redis-server is on PATH, unless REDIS_ADDR is set.
// Server calls it; call it directly in tests that run redis-server
// themselves.
//
// When redis-server is missing it prints a message starting with "REDIS NOT
// INSTALLED" to standard error (once per test binary) and skips the test.
// When the environment variable CI is true it fails the test instead, because
// CI must have redis-server installed (.ci/run installs it).
func Require(t testing.TB) {
	t.Helper()
	if os.Getenv(envAddr) != "" {
		return
	}
	requireBinaries(t, envAddr, serverBin)
}

// envUnit, when true, skips every test that needs a real redis-server
// process: make test-unit sets it.
const envUnit = "TOLLGATE_UNIT"

// requireBinaries skips (or, under CI, fails) the test if any of bins is not
// on PATH. env names the variable that would make them unnecessary.
func requireBinaries(t testing.TB, env string, bins ...string) {
	t.Helper()
	if unit, _ := strconv.ParseBool(os.Getenv(envUnit)); unit && !isCI() {
		t.Skip(envUnit + "=1 (make test-unit): this test needs a real redis-server; make test runs it")
	}
	var missing []string
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("REDIS NOT INSTALLED: %s not found on PATH; install redis-server "+
		"(apt-get install -y redis-server) to run these tests, or set %s to use a running one",
		strings.Join(missing, " and "), env)
	warnOnce.Do(func() {
		fmt.Fprintf(warnOut, "\n!!! %s !!!\n\n", msg)
	})
	if isCI() {
		t.Fatalf("%s\nCI=true: CI must have redis-server installed (.ci/run installs it)", msg)
	}
	t.Skip(msg)
}

func isCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}
