//go:build unix && !linux

package redistest

import (
	"syscall"
	"time"
)

// sysProcAttr puts the child in its own process group, so that a Ctrl-C at
// the terminal is not delivered to it as well as to the test binary. There is
// no parent-death signal outside Linux.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitStopped gives the kernel a moment to deliver SIGSTOP; there is no
// portable way to observe the stopped state.
func waitStopped(pid int, timeout time.Duration) error {
	time.Sleep(10 * time.Millisecond)
	return nil
}
