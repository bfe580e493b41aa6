//go:build unix

package sqsemulator

import "syscall"

// Pause freezes the emulator (SIGSTOP): connections are accepted by the kernel but
// nothing answers, like a broker that hangs.
func (s *Server) Pause() error { return s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause (SIGCONT).
func (s *Server) Resume() error { return s.cmd.Process.Signal(syscall.SIGCONT) }
