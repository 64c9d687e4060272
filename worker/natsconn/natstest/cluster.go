package natstest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/sys1hq/sys1/worker/loopback"
)

// Cluster is a JetStream cluster of in-process nats-servers on loopback, each with its own
// store, for tests of what sys1 does when a node fails. Every node keeps its name, ports and
// store across Shutdown and Restart, so a restarted node is the same node coming back, not a
// new one. Shutdown is nats-server's own (graceful: a leader hands its raft groups over
// before it stops); for a hard crash use ProcessCluster, whose nodes can be SIGKILLed.
type Cluster struct {
	tb        testing.TB
	configure []func(*server.Options)

	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	name        string
	port        int // client port
	clusterPort int
	storeDir    string
	srv         *server.Server // nil while the node is down
}

// ClusterName is the cluster name of the nodes StartCluster and StartProcessCluster run.
const ClusterName = "sys1-test"

// StartCluster runs an n-node JetStream cluster (nodes n1…nN) and waits until it is healthy:
// a meta leader elected and every node current. configure may adjust each node's options
// (max payload, credentials) before it starts, at every start. The nodes are shut down when
// the test ends.
func StartCluster(tb testing.TB, n int, configure ...func(*server.Options)) *Cluster {
	tb.Helper()
	ports := FreePorts(tb, 2*n)
	c := &Cluster{tb: tb, configure: configure}
	for i := range n {
		c.nodes = append(c.nodes, &clusterNode{
			name: fmt.Sprintf("n%d", i+1), port: ports[2*i], clusterPort: ports[2*i+1], storeDir: tb.TempDir(),
		})
	}
	tb.Cleanup(func() {
		for i := range c.nodes {
			c.Shutdown(i)
		}
	})
	for i := range c.nodes {
		c.Restart(i)
	}
	c.WaitHealthy(60 * time.Second)
	return c
}

// FreePorts returns n distinct loopback TCP ports that were free a moment ago (see
// loopback.Ports). A cluster's route list must name every node's port before any node
// starts, so port -1 will not do.
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports, err := loopback.Ports(n)
	if err != nil {
		tb.Fatal(err)
	}
	return ports
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Server is node i's server, nil while it is down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// NodeName is node i's server name ("n1", …), what JetStream reports as a leader.
func (c *Cluster) NodeName(i int) string { return c.nodes[i].name }

// Index is the node whose server name is name, or -1.
func (c *Cluster) Index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// URL is node i's client URL; it stays the same across restarts.
func (c *Cluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].port) }

// URLs lists every node's client URL, node first first: with nats.DontRandomize a client
// connects to that node and fails over to the others in order.
func (c *Cluster) URLs(first int) string { return clusterURLs(len(c.nodes), first, c.URL) }

func clusterURLs(n, first int, url func(int) string) string {
	out := make([]string, 0, n)
	for k := range n {
		out = append(out, url((first+k)%n))
	}
	return strings.Join(out, ",")
}

// Shutdown stops node i (nats-server's graceful shutdown) and waits until it has stopped.
// Stopping a node that is down does nothing.
func (c *Cluster) Shutdown(i int) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart starts node i again with its name, ports and store (it must be down), and waits
// until it accepts clients. It does not wait for JetStream to catch up: see WaitHealthy.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.srv != nil {
		c.tb.Fatalf("node %s is already running", n.name)
	}
	var routes []string
	for _, other := range c.nodes {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", other.clusterPort))
	}
	opts := &server.Options{
		ServerName: n.name, Host: "127.0.0.1", Port: n.port,
		JetStream: true, StoreDir: n.storeDir, NoLog: true, NoSigs: true, JetStreamMaxStore: 1 << 40, // see Start
		Cluster: server.ClusterOpts{Name: ClusterName, Host: "127.0.0.1", Port: n.clusterPort},
		Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
	}
	for _, cf := range c.configure {
		cf(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		c.tb.Fatalf("nats-server %s: %v", n.name, err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		srv.Shutdown()
		c.tb.Fatalf("nats-server %s not ready within 20s", n.name)
	}
	n.srv = srv
}

// Running lists the nodes that are up.
func (c *Cluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, n := range c.nodes {
		if n.srv != nil {
			out = append(out, i)
		}
	}
	return out
}

// Healthy reports whether every running node says it is healthy (nats-server's /healthz: its
// JetStream is up, the meta group has a leader and it is current, and every stream and
// consumer placed on it has caught up), with the first complaint when one is not.
func (c *Cluster) Healthy() (bool, string) {
	for _, i := range c.Running() {
		srv := c.Server(i)
		if srv == nil {
			continue
		}
		if st := srv.Healthz(nil); st.Status != "ok" {
			return false, fmt.Sprintf("%s: %s %s", c.nodes[i].name, st.Status, st.Error)
		}
	}
	var running []*server.Server
	for _, i := range c.Running() {
		if srv := c.Server(i); srv != nil {
			running = append(running, srv)
		}
	}
	return PlacementReady(running)
}

// PlacementReady reports whether the meta leader among servers can place an asset on all of
// them: it counts every running node as an online JetStream peer. /healthz can say ok a moment
// before the leader has the other nodes' first statistics, and an R3 stream created in that
// moment fails with "no suitable peers for placement".
func PlacementReady(servers []*server.Server) (bool, string) {
	for _, srv := range servers {
		if !srv.JetStreamIsLeader() {
			continue
		}
		if peers := srv.JetStreamClusterPeers(); len(peers) < len(servers) {
			return false, fmt.Sprintf("meta leader %s sees %d of %d JetStream peers (%v)", srv.Name(), len(peers), len(servers), peers)
		}
		return true, ""
	}
	return false, "no meta leader"
}

// WaitHealthy waits until Healthy holds, failing the test with the last complaint if within
// passes first.
func (c *Cluster) WaitHealthy(within time.Duration) {
	c.tb.Helper()
	waitHealthy(c.tb, within, c.Healthy)
}

func waitHealthy(tb testing.TB, within time.Duration, healthy func() (bool, string)) {
	tb.Helper()
	WaitUntil(tb, within, "the cluster to become healthy", healthy)
}

// WaitUntil is WaitFor for a condition that can say why it does not hold yet: the test
// fails with the last reason when within passes first.
func WaitUntil(tb testing.TB, within time.Duration, what string, cond func() (ok bool, why string)) {
	tb.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return
		}
		select {
		case <-deadline.C:
			tb.Fatalf("timed out after %s waiting for %s: %s", within, what, why)
		case <-tick.C:
		}
	}
}
