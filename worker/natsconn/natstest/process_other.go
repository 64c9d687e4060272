//go:build !linux

package natstest

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent's; elsewhere the test's
// cleanup alone ends the nodes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
