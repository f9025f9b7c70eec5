//go:build linux

package redistest

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"time"
)

// sysProcAttr puts the child in its own process group, so that a Ctrl-C at
// the terminal is not delivered to it as well as to the test binary, and asks
// the kernel to SIGKILL it when the test binary dies.
//
// Pdeathsig is tied to the OS thread that started the child, not to the whole
// process; the Go runtime only retires threads whose goroutine exited while
// locked with runtime.LockOSThread, which this package never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until the kernel reports pid as stopped (state T), so
// that Pause returns only once the server has really stopped answering.
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	path := fmt.Sprintf("/proc/%d/stat", pid)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
			if s := b[i+2]; s == 'T' || s == 't' {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped after %v", pid, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
