//go:build !unix

package redistest

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// signalsSupported reports whether Pause and Resume can work on this platform.
const signalsSupported = false

var errNoSignals = errors.New("redistest: SIGSTOP/SIGCONT are not supported on this platform")

func sysProcAttr() *syscall.SysProcAttr { return nil }

func terminate(p *os.Process) error { return p.Kill() }

func stopProcess(p *os.Process) error { return errNoSignals }

func continueProcess(p *os.Process) error { return errNoSignals }

func killGroup(pid int) {}

func waitStopped(pid int, timeout time.Duration) error { return nil }
