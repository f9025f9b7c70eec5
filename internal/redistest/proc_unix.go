//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// signalsSupported reports whether Pause and Resume can work on this platform.
const signalsSupported = true

func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

func stopProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func continueProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// killGroup sends SIGKILL to the process group led by pid, which reaps any
// child that redis-server forked (for example for a replication sync) after
// the server itself has exited. It is called only after the server has been
// waited for.
func killGroup(pid int) {
	if pid <= 0 {
		return
	}
	// ESRCH (the group is already empty) is the usual answer and is fine.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
