// Package proc starts the processes cmd/report needs — a redis-server and
// the benchmark's HTTP servers — so that they stop by themselves: each runs
// in its own process group and, on Linux, gets SIGKILL when the report dies.
// Processes are only ever signalled by their own PID.
//
// (internal/redistest does the same for tests but reports through a
// testing.TB, which a command does not have.)
package proc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Command is exec.CommandContext with the process attributes of Start: the
// child runs in its own process group and, on Linux, dies with its parent.
func Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Process is a started child process.
type Process struct {
	Cmd  *exec.Cmd
	done chan struct{} // closed once Wait has returned
	err  error         // Wait's result, readable after done
}

// Start starts cmd in its own process group, with a parent-death signal on
// Linux, and reaps it when it exits.
func Start(cmd *exec.Cmd) (*Process, error) {
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID is the process's ID.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM, then SIGKILL if the process has not exited within
// grace, and waits for it.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.Cmd.Process.Kill()
	select {
	case <-p.done:
		return fmt.Errorf("%s (pid %d) ignored SIGTERM for %v; killed", p.Cmd.Path, p.PID(), grace)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 10s after SIGKILL", p.Cmd.Path, p.PID())
	}
}

// Redis is a redis-server started by StartRedis.
type Redis struct {
	*Process
	Addr string
	Log  string // path of its log file
}

// StartRedis starts redis-server on a free port of 127.0.0.1, without
// persistence, with its directory and log in dir, and returns once it
// answers (as itself: INFO must report its PID).
func StartRedis(dir string, args ...string) (*Redis, error) {
	var lastErr error
	for range 5 { // the port may be taken between choosing and binding it
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		r, err := startRedis(dir, port, args)
		if err == nil {
			return r, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

func startRedis(dir string, port int, extra []string) (*Redis, error) {
	logPath := filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own copy
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
	}, extra...)
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = log, log
	p, err := Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	r := &Redis{Process: p, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Log: logPath}
	if err := r.waitReady(10 * time.Second); err != nil {
		_ = p.Stop(2 * time.Second)
		tail, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("redis-server on %s: %w\n%s", r.Addr, err, lastLines(string(tail), 10))
	}
	return r, nil
}

func (r *Redis) waitReady(timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, PoolSize: 1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		if r.Exited() {
			return fmt.Errorf("exited during startup: %v", r.err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			if pid := InfoField(info, "process_id"); pid != strconv.Itoa(r.PID()) {
				return fmt.Errorf("port answered by another redis-server (pid %s)", pid)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// InfoField returns the value of key in the output of INFO.
func InfoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), key+":"); ok {
			return v
		}
	}
	return ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
