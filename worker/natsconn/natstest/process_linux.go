package natstest

import "syscall"

// sysProcAttr makes a node die with the test binary, should it be killed before its cleanup
// runs: no nats-server outlives the test that started it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
