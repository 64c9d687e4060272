package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/cmd/sys1/loadtest"
	"github.com/sys1hq/sys1/worker/loopback"
)

// fairDeployOptions say how to start one deployment of bench --fairness.
type fairDeployOptions struct {
	bin             string // the sys1 binary the NATS node and the worker run as
	fairShare       bool   // SYS1_FAIR_SHARE
	concurrency     int
	concurrencyMode string
	fetchBatch      int
	providerURL     string // the fake Ollama (in the bench process)
	natsSync        string // the server's sync_interval
}

// fairDeployment is a deployment of its own for each measurement of bench --fairness: a NATS
// server and a `sys1 worker`, each a process of its own (`sys1 soak --nats-node`, as the soak
// starts its nodes), so /proc tells the worker's CPU and memory from the server's; the fake
// Ollama and the load generator stay in the bench process. A fresh store per deployment: no
// measurement inherits another's backlog, consumers or run records.
type fairDeployment struct {
	dir      string
	url      string
	httpAddr string
	nats     *fairProc
	worker   *fairProc
}

// fairProc is one child process and its end.
type fairProc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startFairProc(name, bin string, args, env []string, logPath string) (*fairProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group (a terminal's Ctrl-C reaches the bench, which stops it in
	// order), and SIGKILL should the bench die first: nothing outlives the bench.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &fairProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *fairProc) pid() int { return p.cmd.Process.Pid }

func (p *fairProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to grace, then SIGKILLs.
func (p *fairProc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill SIGKILLs the process and waits for its end.
func (p *fairProc) kill() {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// failure describes a process that did not come up, with the end of its log.
func (p *fairProc) failure(what string) error {
	tail, _ := os.ReadFile(p.log)
	if len(tail) > 1500 {
		tail = tail[len(tail)-1500:]
	}
	state := "still running"
	if p.exited() {
		state = fmt.Sprintf("exited: %v", p.err)
	}
	return fmt.Errorf("%s %s (%s); its log ends:\n%s", p.name, what, state, strings.TrimSpace(string(tail)))
}

func (p *fairProc) usage() loadtest.ProcessUsage {
	u, _ := loadtest.ReadProcess(p.pid())
	return u
}

func startFairDeployment(ctx context.Context, o fairDeployOptions) (_ *fairDeployment, err error) {
	d := &fairDeployment{}
	if d.dir, err = os.MkdirTemp("", "sys1-bench-fair-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.stop()
		}
	}()
	ports, err := loopback.Ports(2)
	if err != nil {
		return nil, err
	}
	d.url = fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	d.httpAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
	conf := filepath.Join(d.dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(fairNATSConfig(ports[0], filepath.Join(d.dir, "store"), o.natsSync)), 0o644); err != nil {
		return nil, err
	}
	if d.nats, err = startFairProc("nats-server", o.bin, []string{"soak", "--nats-node", conf}, baseChildEnv(), filepath.Join(d.dir, "nats.log")); err != nil {
		return nil, err
	}
	if err := waitJetStream(ctx, d.url, d.nats); err != nil {
		return nil, err
	}
	env := append(baseChildEnv(),
		"SYS1_NATS_URL="+d.url,
		"SYS1_PROVIDER=ollama",
		"SYS1_OLLAMA_BASE_URL="+o.providerURL,
		"SYS1_CONCURRENCY="+strconv.Itoa(o.concurrency),
		"SYS1_CONCURRENCY_MODE="+o.concurrencyMode,
		"SYS1_FAIR_SHARE="+strconv.FormatBool(o.fairShare),
		"SYS1_HTTP_ADDR="+d.httpAddr,
		"SYS1_WORKER_ID=bench-fair",
		"SYS1_LOG_LEVEL=warn",
	)
	if o.fetchBatch > 0 {
		env = append(env, "SYS1_FETCH_BATCH="+strconv.Itoa(o.fetchBatch))
	}
	if d.worker, err = startFairProc("sys1 worker", o.bin, []string{"worker"}, env, filepath.Join(d.dir, "worker.log")); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, "http://"+d.httpAddr+"/readyz", d.worker); err != nil {
		return nil, err
	}
	return d, nil
}

// fairNATSConfig is the server's configuration: one node, JetStream, the durability asked for.
func fairNATSConfig(port int, store, sync string) string {
	return fmt.Sprintf(`# sys1 bench --fairness: one NATS node
listen: 127.0.0.1:%d
max_payload: 8MB
jetstream {
  store_dir: %q
  sync_interval: %s
  # sys1's stream and bucket limits add up to 23.7 GiB (README, Storage budget): reserve them
  # whatever the disk's free space says, as the embedded server does.
  max_file_store: 1TB
  max_memory_store: 1GB
}
`, port, store, sync)
}

// baseChildEnv is what the child processes inherit: none of the bench's own SYS1_* settings.
func baseChildEnv() []string {
	var out []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "TZ", "GOMAXPROCS", "GOGC", "GOMEMLIMIT", "GORACE", "GOCOVERDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// waitJetStream waits until the server answers JetStream requests.
func waitJetStream(ctx context.Context, url string, p *fairProc) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if nc, err := nats.Connect(url, nats.Timeout(time.Second)); err == nil {
			js, jerr := jetstream.New(nc)
			if jerr == nil {
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, jerr = js.AccountInfo(actx)
				cancel()
			}
			nc.Close()
			if jerr == nil {
				return nil
			}
		}
		if p.exited() || time.Now().After(deadline) {
			return p.failure("did not start")
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitReady waits until the worker's /readyz answers 200: connected, its topology in place
// and the provider probed.
func waitReady(ctx context.Context, url string, p *fairProc) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := client.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.exited() || time.Now().After(deadline) {
			return p.failure("did not become ready")
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// connect opens a producer connection (one per caller, as separate producers would have).
func (d *fairDeployment) connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(d.url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to the bench's NATS server: %w", err)
	}
	return nc, nil
}

// stop ends the deployment once measured and removes its store: whatever was still queued
// goes with it. The worker is killed rather than stopped (a graceful stop takes it a second,
// and nothing of it is measured any more); the server is stopped.
func (d *fairDeployment) stop() {
	d.worker.kill()
	d.nats.stop(10 * time.Second)
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}

// stopped reports a process of the deployment that ended during a measurement.
func (d *fairDeployment) stopped() error {
	for _, p := range []*fairProc{d.nats, d.worker} {
		if p != nil && p.exited() {
			return p.failure("ended during the measurement")
		}
	}
	return nil
}
