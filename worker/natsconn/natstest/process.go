package natstest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// BuildServer builds the nats-server command of the version go.mod requires into a
// temporary directory and returns its path; the Go build cache makes every build after the
// first take about a second. It skips the test, saying why, when the binary cannot be built
// (no go command, no module sources offline).
func BuildServer(tb testing.TB) string {
	tb.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		tb.Skipf("cannot build nats-server for a multi-process cluster: no go command (%v)", err)
	}
	out := filepath.Join(tb.TempDir(), "nats-server")
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/nats-io/nats-server/v2")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Skipf("cannot build nats-server for a multi-process cluster (go build github.com/nats-io/nats-server/v2: %v):\n%s", err, b)
	}
	return out
}

// ProcessCluster is a JetStream cluster of nats-server processes on loopback: unlike Cluster's
// in-process nodes, a node can be killed with SIGKILL, the way a machine dies, so no leader
// hands anything over first. Every node keeps its name, ports and store across Kill and
// Restart. Nodes are killed when the test ends; their logs are printed if it failed.
type ProcessCluster struct {
	tb  testing.TB
	bin string

	mu    sync.Mutex
	nodes []*processNode
}

type processNode struct {
	name                        string
	port, clusterPort, httpPort int
	conf, log                   string
	cmd                         *exec.Cmd     // nil while the node is down
	exited                      chan struct{} // closed when cmd has exited
}

// StartProcessCluster runs an n-node JetStream cluster of bin (see BuildServer), nodes n1…nN,
// and waits until it is healthy. extraConf is appended to every node's configuration file
// (nats-server syntax), e.g. "max_payload: 8MB".
func StartProcessCluster(tb testing.TB, bin string, n int, extraConf string) *ProcessCluster {
	tb.Helper()
	ports := FreePorts(tb, 3*n)
	c := &ProcessCluster{tb: tb, bin: bin}
	dir := tb.TempDir()
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i+1]))
	}
	for i := range n {
		node := &processNode{
			name: fmt.Sprintf("n%d", i+1), port: ports[3*i], clusterPort: ports[3*i+1], httpPort: ports[3*i+2],
		}
		store := filepath.Join(dir, node.name, "store")
		node.conf = filepath.Join(dir, node.name, "nats-server.conf")
		node.log = filepath.Join(dir, node.name, "nats-server.log")
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream { store_dir: %q, max_file_store: 1TB }
cluster {
  name: %s
  listen: 127.0.0.1:%d
  routes: [ %s ]
}
%s
`, node.name, node.port, node.httpPort, store, ClusterName, node.clusterPort, strings.Join(routes, ", "), extraConf)
		if err := os.MkdirAll(store, 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(node.conf, []byte(conf), 0o644); err != nil {
			tb.Fatal(err)
		}
		c.nodes = append(c.nodes, node)
	}
	tb.Cleanup(func() {
		for i := range c.nodes {
			c.Kill(i)
		}
		if tb.Failed() {
			for i := range c.nodes {
				tb.Logf("--- log of nats-server %s (last 4 KiB) ---\n%s", c.nodes[i].name, c.LogTail(i, 4<<10))
			}
		}
	})
	for i := range c.nodes {
		c.Restart(i)
	}
	c.WaitHealthy(60 * time.Second)
	return c
}

// Size is the number of nodes.
func (c *ProcessCluster) Size() int { return len(c.nodes) }

// NodeName is node i's server name ("n1", …), what JetStream reports as a leader.
func (c *ProcessCluster) NodeName(i int) string { return c.nodes[i].name }

// Index is the node whose server name is name, or -1.
func (c *ProcessCluster) Index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// URL is node i's client URL; it stays the same across restarts.
func (c *ProcessCluster) URL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].port)
}

// URLs lists every node's client URL, node first first (see Cluster.URLs).
func (c *ProcessCluster) URLs(first int) string { return clusterURLs(len(c.nodes), first, c.URL) }

// Kill ends node i's process with SIGKILL (no shutdown of any kind: its raft groups lose a
// member mid-flight, as when a machine dies) and waits for it to exit. Killing a node that is
// down does nothing.
func (c *ProcessCluster) Kill(i int) {
	c.mu.Lock()
	n := c.nodes[i]
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		c.tb.Errorf("nats-server %s did not exit within 10s of SIGKILL", n.name)
	}
}

// Restart starts node i's process again with its configuration and store (it must be down)
// and waits until its monitoring port answers. It does not wait for JetStream to catch up:
// see WaitHealthy.
func (c *ProcessCluster) Restart(i int) {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd != nil {
		c.tb.Fatalf("nats-server %s is already running", n.name)
	}
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.tb.Fatal(err)
	}
	fmt.Fprintf(logf, "=== start %s ===\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, "-c", n.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.tb.Fatalf("start nats-server %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited

	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := httpGet(n.httpPort, "/varz"); err == nil {
			return
		}
		select {
		case <-exited:
			c.tb.Fatalf("nats-server %s exited at start:\n%s", n.name, tail(n.log, 4<<10))
		case <-time.After(20 * time.Millisecond): // polling the monitoring port with a deadline
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("nats-server %s not answering within 20s:\n%s", n.name, tail(n.log, 4<<10))
		}
	}
}

// Running lists the nodes that are up.
func (c *ProcessCluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, n := range c.nodes {
		if n.cmd != nil {
			out = append(out, i)
		}
	}
	return out
}

// Healthy reports whether every running node's /healthz says ok (see Cluster.Healthy), with
// the first complaint when one does not.
func (c *ProcessCluster) Healthy() (bool, string) {
	for _, i := range c.Running() {
		if err := httpGet(c.nodes[i].httpPort, "/healthz"); err != nil {
			return false, fmt.Sprintf("%s: %v", c.nodes[i].name, err)
		}
	}
	return true, ""
}

// WaitHealthy waits until Healthy holds, failing the test with the last complaint if within
// passes first.
func (c *ProcessCluster) WaitHealthy(within time.Duration) {
	c.tb.Helper()
	waitHealthy(c.tb, within, c.Healthy)
}

// LogTail is the last max bytes of node i's log.
func (c *ProcessCluster) LogTail(i, max int) string { return tail(c.nodes[i].log, max) }

var monitorClient = &http.Client{Timeout: 2 * time.Second}

func httpGet(port int, path string) error {
	resp, err := monitorClient.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status + ": " + strings.TrimSpace(string(body)))
	}
	return nil
}

func tail(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
