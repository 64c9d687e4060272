package worker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// Issue 17 §5: a NATS node that dies hard (SIGKILL: no leadership is handed over, its raft
// groups wait out an election of several seconds) while it leads the run-id gate's bucket,
// just as a full set of model answers comes back to be stored there. Every run must still be
// scored exactly once, answered and recorded: an answer in hand survives the store failing
// (retried in place, the delivery kept alive), and nothing is paid for twice. Then the node
// comes back with its store and the cluster heals.
func TestKillGateLeaderProcess(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	bin := natstest.BuildServer(t)
	c := natstest.StartProcessCluster(t, bin, 3, "max_payload: 8MB")
	h := newClusterHarness(t, c, 2)
	h.topo.AckWait = 30 * time.Second // the deployed default: longer than an election
	h.startWorker(0)
	h.startWorker(1)
	l := h.startLoad(clusterRuns, clusterProducers)
	l.awaitAnswered(clusterRuns/3, 60*time.Second)

	gate := h.gateStream()
	leader := h.leaderOf(gate)
	held := h.holdAnswers()
	killed := time.Now()
	c.Kill(c.Index(leader))
	h.prov.release() // the answers come back while the bucket has no leader
	next := h.leaderOf(gate, leader)
	elected := time.Since(killed)
	l.awaitAnswered(2*clusterRuns/3, 90*time.Second) // the load goes on with a node dead

	// The answers in hand met the leaderless bucket: their stores failed and were retried in
	// place. Without this the test would prove nothing about §5.
	if !strings.Contains(h.logs.String(), "could not store the outcome; retrying in place") {
		t.Errorf("no outcome store failed while the gate's leader was dead; the kill did not meet the answers in hand")
	}

	restarted := time.Now()
	c.Restart(c.Index(leader))
	c.WaitHealthy(90 * time.Second)
	healed := time.Since(restarted)
	took := l.wait()
	h.awaitReplicasCurrent()
	h.verify(l)
	t.Logf("%s leader %s killed (SIGKILL) with %d answers in hand; %s led after %s; restarted node healthy after %s",
		gate, leader, held, next, elected.Round(time.Millisecond), healed.Round(time.Millisecond))
	h.report(l, took, "gate leader killed")
}
