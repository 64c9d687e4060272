package soak

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// proc is one supervised process of the fleet — a worker slot, a NATS node, the sink, the
// review page — started, SIGKILLed and started again by the soak. Each start is one
// incarnation. A process that exits on its own is recorded (the processes check reports it)
// and, like a pod, started again after a second.
type proc struct {
	name string
	slot int
	bin  string
	args []string
	// env is the environment of incarnation gen (a worker's id names its incarnation).
	env     func(gen int) []string
	logPath string
	tl      *Timeline
	// restart is whether the soak starts it again when it exits on its own; oneShot marks a
	// command that is meant to end (sys1 batch run): its end is not "on its own".
	restart, oneShot bool

	mu      sync.Mutex
	cmd     *exec.Cmd
	cur     *Incarnation
	gens    []*Incarnation
	exited  chan struct{} // closed when cur's process has exited
	closing bool          // the soak is ending: no restarts
}

func newProc(name string, slot int, bin string, args []string, env func(int) []string, logDir string, tl *Timeline) *proc {
	return &proc{name: name, slot: slot, bin: bin, args: args, env: env, logPath: filepath.Join(logDir, name+".log"), tl: tl, restart: true}
}

// start starts a new incarnation; the process must be down.
func (p *proc) start(detail string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.name)
	}
	gen := len(p.gens) + 1
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	now := time.Now()
	fmt.Fprintf(logf, "=== %s incarnation %d started %s ===\n", p.name, gen, now.Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env(gen)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group (a terminal's Ctrl-C reaches the soak, which stops the fleet in
	// order), and SIGKILL should the soak die first: no process outlives the soak.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	inc := &Incarnation{Name: p.name, Slot: p.slot, Gen: gen, PID: cmd.Process.Pid, Started: now}
	exited := make(chan struct{})
	p.cmd, p.cur, p.exited = cmd, inc, exited
	p.gens = append(p.gens, inc)
	d := fmt.Sprintf("pid %d, incarnation %d", inc.PID, gen)
	if detail != "" {
		d = detail + "; " + d
	}
	p.tl.Add(Event{At: now, What: "start", Target: p.name, Detail: d})
	go p.wait(cmd, inc, exited, logf)
	return nil
}

// wait records the incarnation's end, and starts a process that exited on its own again.
func (p *proc) wait(cmd *exec.Cmd, inc *Incarnation, exited chan struct{}, logf *os.File) {
	err := cmd.Wait()
	now := time.Now()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	fmt.Fprintf(logf, "=== %s incarnation %d ended %s (exit status %d) ===\n", p.name, inc.Gen, now.Format(time.RFC3339Nano), code)
	logf.Close()
	p.mu.Lock()
	inc.Ended, inc.ExitCode = now, code
	own := !inc.Killed && !inc.Stopped
	if own {
		inc.LogTail = tailFile(p.logPath, 2048)
	}
	if p.cmd == cmd {
		p.cmd, p.cur = nil, nil
	}
	closing := p.closing
	p.mu.Unlock()
	close(exited)
	if own && p.oneShot {
		p.tl.Add(Event{At: now, What: "finished", Target: p.name, Detail: fmt.Sprintf("exit status %d", code)})
	} else if own {
		p.tl.Add(Event{At: now, What: "exited on its own", Target: p.name, Detail: fmt.Sprintf("exit status %d, incarnation %d", code, inc.Gen)})
		if p.restart && !closing {
			time.AfterFunc(time.Second, func() {
				if err := p.start("after exiting on its own"); err != nil {
					p.tl.Add(Event{What: "cannot start", Target: p.name, Detail: err.Error()})
				}
			})
		}
	}
}

// kill SIGKILLs the running incarnation and waits until it is gone. It reports whether one ran.
func (p *proc) kill(detail string) bool {
	p.mu.Lock()
	cmd, inc, exited := p.cmd, p.cur, p.exited
	if cmd == nil {
		p.mu.Unlock()
		return false
	}
	inc.Killed = true
	p.mu.Unlock()
	d := fmt.Sprintf("pid %d, incarnation %d", inc.PID, inc.Gen)
	if detail != "" {
		d = detail + "; " + d
	}
	p.tl.Add(Event{What: "kill", Target: p.name, Detail: d})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return true
}

// stop ends the running incarnation with SIGTERM, and SIGKILL after grace; it reports the
// exit status (-1 when nothing ran).
func (p *proc) stop(grace time.Duration) int {
	p.mu.Lock()
	p.closing = true
	cmd, inc, exited := p.cmd, p.cur, p.exited
	if cmd == nil {
		p.mu.Unlock()
		return -1
	}
	inc.Stopped = true
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return inc.ExitCode
}

// running reports whether an incarnation runs now.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// done is closed when the running incarnation exits (nil when none runs).
func (p *proc) done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.exited
}

// incarnations are copies of every incarnation so far.
func (p *proc) incarnations() []Incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Incarnation, len(p.gens))
	for i, g := range p.gens {
		out[i] = *g
	}
	return out
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
