package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// TestStartUpRidesOutTheRequestStreamLeadersDeath is issue 24's start-up failure: a worker (and
// a sink and a review page) started right after the NATS node leading SYS1_REQUESTS was
// SIGKILLed. Before, the first stream look-up timed out after 5 s and the command exited 2
// ("configuration error") — a crash loop exactly while the fleet needed its replicas. Now each
// waits with back-off, alive (/healthz 200) and not ready (/readyz 503, saying it waits for
// JetStream), and becomes ready once a leader is elected.
//
// A second node is killed with the leader so the wait is certain (no quorum: no election can
// end), and brought back once every component has shown it waits: the new leader is elected
// from the two nodes that are up, and the old leader stays dead throughout.
func TestStartUpRidesOutTheRequestStreamLeadersDeath(t *testing.T) {
	db := chtest.New(t)
	bin := natstest.BuildServer(t)
	c := natstest.StartProcessCluster(t, bin, 3, "max_payload: 8MB")
	topo := topology.Default()
	topo.Replicas = 3

	// The fleet existed before: the streams are R3, led by some node.
	nc, err := nats.Connect(c.URLs(0), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := topology.Ensure(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	leader := streamLeader(t, js, topo.RequestsStream)
	dead := c.Index(leader)
	other := (dead + 1) % 3
	c.Kill(dead)
	c.Kill(other)

	t.Setenv("SYS1_NATS_URL", c.URLs(0))
	t.Setenv("SYS1_STREAM_REPLICAS", "3")
	t.Setenv("SYS1_PROVIDER", "simulator")
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	good, _ := bcrypt.GenerateFromPassword([]byte("a long password"), bcrypt.MinCost)
	t.Setenv("SYS1_REVIEW_USERS", writeReviewers(t, "alice:"+string(good)+"\n"))
	type component struct {
		name string
		args []string
		addr string
		logs *natstest.Buffer
		exit chan int
	}
	var comps []*component
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	for _, name := range []string{"worker", "sink", "review"} {
		cp := &component{name: name, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), logs: &natstest.Buffer{}, exit: make(chan int, 1)}
		cp.args = []string{name}
		if name == "review" {
			cp.args = append(cp.args, "--http", cp.addr)
		} else {
			t.Setenv("SYS1_HTTP_ADDR", cp.addr) // read at start, before the next component's
		}
		go func() { cp.exit <- run(runCtx, cp.args, &bytes.Buffer{}, cp.logs) }()
		comps = append(comps, cp)
		// Each reads its environment at once; wait until it serves, so SYS1_HTTP_ADDR can
		// change for the next.
		natstest.WaitFor(t, 30*time.Second, name+" serving /healthz", func() bool {
			checkRunning(t, cp.name, cp.exit, cp.logs)
			code, _ := getStatus("http://" + cp.addr + "/healthz")
			return code == http.StatusOK
		})
	}

	// With the leader dead and no quorum, every component waits, not ready, and says why.
	for _, cp := range comps {
		natstest.WaitFor(t, 60*time.Second, cp.name+" saying it waits for JetStream", func() bool {
			checkRunning(t, cp.name, cp.exit, cp.logs)
			code, body := getStatus("http://" + cp.addr + "/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(cp.logs.String(), "yet (NATS is failing over or a node is down); not ready, retrying") &&
				(cp.name == "sink" || strings.Contains(body, "waiting for JetStream"))
		})
	}

	// A second node back: a new leader is elected among the two, and every component
	// becomes ready without a restart.
	c.Restart(other)
	for _, cp := range comps {
		natstest.WaitFor(t, 120*time.Second, cp.name+" ready", func() bool {
			checkRunning(t, cp.name, cp.exit, cp.logs)
			code, _ := getStatus("http://" + cp.addr + "/readyz")
			return code == http.StatusOK
		})
	}
	if now := streamLeader(t, js, topo.RequestsStream); now == leader {
		t.Fatalf("%s still led by %s, the node that was killed", topo.RequestsStream, leader)
	}
	stop()
	for _, cp := range comps {
		select {
		case code := <-cp.exit:
			if code != exitOK {
				t.Errorf("%s exit %d after SIGTERM:\n%s", cp.name, code, lastLines(cp.logs.String(), 30))
			}
		case <-time.After(60 * time.Second):
			t.Errorf("%s did not stop", cp.name)
		}
	}
}

// TestStartUpStopsOnAPermanentError: what no wait can fix still stops start-up at once with
// exit status 2 — here a request stream that exists with another retention than sys1's.
func TestStartUpStopsOnAPermanentError(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := topology.Default().RequestsStreamConfig()
	cfg.Retention = jetstream.LimitsPolicy
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_PROVIDER", "simulator")
	var stderr natstest.Buffer
	done := make(chan int, 1)
	go func() { done <- run(context.Background(), []string{"worker"}, &bytes.Buffer{}, &stderr) }()
	select {
	case code := <-done:
		if code != exitUsage || !strings.Contains(stderr.String(), "exists with retention") {
			t.Fatalf("exit %d, want %d naming the retention:\n%s", code, exitUsage, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker waited on a permanent error:\n%s", stderr.String())
	}
}

func streamLeader(t *testing.T, js jetstream.JetStream, name string) string {
	t.Helper()
	var leader string
	natstest.WaitFor(t, 60*time.Second, "a leader of "+name, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		leader = info.Cluster.Leader
		return true
	})
	return leader
}

func checkRunning(t *testing.T, name string, exit chan int, logs *natstest.Buffer) {
	t.Helper()
	select {
	case code := <-exit:
		t.Fatalf("%s exited with %d while NATS failed over:\n%s", name, code, lastLines(logs.String(), 30))
	default:
	}
}

func getStatus(url string) (int, string) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
