package worker_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// The in-process cluster tests: three nats-servers in this process, R3 streams and buckets,
// two worker replicas on nodes n1 and n2, the producers and the test on n3 (failing over in
// order). A node is stopped with nats-server's own shutdown, which hands its leaderships over
// first; TestKillGateLeaderProcess (killnode_test.go) kills processes instead.

const (
	clusterRuns      = 300
	clusterProducers = 16
)

// startCluster starts the cluster, the harness and two workers. ackWait is SYS1_ACK_WAIT:
// the deployed 30s where an outage lasts seconds (no delivery in hand may outlive it
// unacknowledged), shorter where leaderships move in milliseconds, because an ack lost with a
// node is redelivered only after it (answered from the stored outcome), and the test waits for
// those.
func startCluster(t *testing.T, ackWait time.Duration) (*natstest.Cluster, *clusterHarness) {
	t.Helper()
	c := natstest.StartCluster(t, 3, func(o *server.Options) { o.MaxPayload = 8 << 20 })
	h := newClusterHarness(t, c, 2)
	h.topo.AckWait = ackWait
	h.startWorker(0)
	h.startWorker(1)
	return c, h
}

// failLeaderMidRun stops the node leading stream while runs are in flight, with the answers of
// a full set of model calls held until the node is down, then lets the load go on on two
// nodes, restarts the node and checks every run.
func failLeaderMidRun(t *testing.T, stream func(*clusterHarness) string) {
	c, h := startCluster(t, 10*time.Second)
	l := h.startLoad(clusterRuns, clusterProducers)
	l.awaitAnswered(clusterRuns/3, 60*time.Second)

	name := stream(h)
	leader := h.leaderOf(name)
	held := h.holdAnswers()
	down := time.Now()
	c.Shutdown(c.Index(leader))
	h.prov.release()
	next := h.leaderOf(name, leader)
	elected := time.Since(down)
	l.awaitAnswered(2*clusterRuns/3, 90*time.Second) // the load goes on with a node down

	c.Restart(c.Index(leader))
	c.WaitHealthy(60 * time.Second)
	took := l.wait()
	h.awaitReplicasCurrent()
	h.verify(l)
	t.Logf("%s leader %s stopped with %d answers in hand; %s led after %s", name, leader, held, next, elected.Round(time.Millisecond))
	h.report(l, took, "leader failover")
}

// The leader of SYS1_REQUESTS (and so of the work queue's messages) stops mid-run.
func TestClusterRequestsLeaderFailover(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	failLeaderMidRun(t, func(h *clusterHarness) string { return h.topo.RequestsStream })
}

// The leader of the run-id gate's bucket stops just as a full set of model answers comes back
// to be stored there.
func TestClusterGateLeaderFailover(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	failLeaderMidRun(t, (*clusterHarness).gateStream)
}

// The node a worker is connected to dies: the worker reconnects to another node and carries
// on, and its runs in hand are answered once.
func TestClusterWorkerNodeDies(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	c, h := startCluster(t, 10*time.Second)
	l := h.startLoad(clusterRuns, clusterProducers)
	l.awaitAnswered(clusterRuns/3, 60*time.Second)

	w := h.workers[0]
	node := c.Index(w.nc.ConnectedServerName())
	if node != 0 {
		t.Fatalf("worker 1 is on %s, want n1", w.nc.ConnectedServerName())
	}
	h.holdAnswers()
	c.Shutdown(node)
	h.prov.release()
	waitFor(t, "worker 1 reconnected to another node", 30*time.Second, func() bool {
		return w.nc.IsConnected() && w.nc.ConnectedServerName() != c.NodeName(node)
	})
	before := w.w.Stats().Succeeded
	waitFor(t, "worker 1 carried on: 20 more runs finished on its new node", 90*time.Second, func() bool {
		return w.w.Stats().Succeeded >= before+20
	})
	t.Logf("worker 1 moved from %s to %s", c.NodeName(node), w.nc.ConnectedServerName())

	c.Restart(node)
	c.WaitHealthy(60 * time.Second)
	took := l.wait()
	h.awaitReplicasCurrent()
	h.verify(l)
	h.report(l, took, "worker's node died")
}

// The whole cluster goes down (every node, with a full set of answers in hand) and comes back
// with its stores: the runs in hand store their outcomes once it is back, and the load
// finishes.
func TestClusterRestartsWhole(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	c, h := startCluster(t, 30*time.Second)
	l := h.startLoad(clusterRuns, clusterProducers)
	l.awaitAnswered(clusterRuns/3, 60*time.Second)

	held := h.holdAnswers()
	before := int(l.answered.Load())
	down := time.Now()
	for i := range c.Size() {
		c.Shutdown(i)
	}
	h.prov.release()
	for i := range c.Size() {
		c.Restart(i)
	}
	c.WaitHealthy(90 * time.Second)
	healthy := time.Since(down)
	l.awaitAnswered(min(before+held, clusterRuns), 90*time.Second) // the answers that were in hand
	t.Logf("cluster healthy %s after going down with %d answers in hand; %d runs answered %s after it went down",
		healthy.Round(time.Millisecond), held, min(before+held, clusterRuns), time.Since(down).Round(time.Millisecond))
	took := l.wait()
	h.awaitReplicasCurrent()
	h.verify(l)
	h.report(l, took, "whole cluster restart")
}
