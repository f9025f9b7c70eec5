//go:build linux

package proc

import "syscall"

// sysProcAttr puts the child in its own process group (a Ctrl-C reaches only
// the report, which then stops its children by PID) and has the kernel
// SIGKILL it if the report dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
