package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsNode is one NATS node of the soak's cluster: its process, ports and store.
type natsNode struct {
	proc                        *proc
	name                        string // the server name, what JetStream reports as a leader
	port, clusterPort, httpPort int
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// natsCluster is the soak's JetStream cluster.
type natsCluster struct {
	nodes []*natsNode
}

// writeNATSConfigs writes each node's configuration: a 3-node JetStream cluster on loopback,
// with the durability deploy/nats ships (sync_interval), and no authentication (the soak's
// callers are told apart by their subject token, SYS1_AUTH_MODE=subject).
func writeNATSConfigs(dir string, n int, syncInterval string, ports []int) ([]*natsNode, []string, error) {
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+1]))
	}
	var nodes []*natsNode
	var confs []string
	for i := range n {
		node := &natsNode{name: fmt.Sprintf("n%d", i+1), port: ports[3*i], clusterPort: ports[3*i+1], httpPort: ports[3*i+2]}
		store := filepath.Join(dir, "nats", node.name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, nil, err
		}
		conf := fmt.Sprintf(`# sys1 soak: NATS node %s of %d
server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
max_payload: 8MB
jetstream {
  store_dir: %q
  sync_interval: %s
  # sys1's stream and bucket limits add up to 23.7 GiB a node (README, Storage budget); three
  # nodes on one disk reserve that each, whatever its free space says.
  max_file_store: 1TB
  max_memory_store: 1GB
}
cluster {
  name: sys1-soak
  listen: 127.0.0.1:%d
  routes: [ %s ]
}
`, node.name, n, node.name, node.port, node.httpPort, store, syncInterval, node.clusterPort, strings.Join(routes, ", "))
		path := filepath.Join(dir, "nats", node.name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, nil, err
		}
		nodes = append(nodes, node)
		confs = append(confs, path)
	}
	return nodes, confs, nil
}

// urls lists every node's client URL, node first first.
func (c *natsCluster) urls(first int) string {
	var out []string
	for i := range c.nodes {
		out = append(out, c.nodes[(first+i)%len(c.nodes)].url())
	}
	return strings.Join(out, ",")
}

// index is the node whose server name is name, or -1.
func (c *natsCluster) index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

var monitor = &http.Client{Timeout: 2 * time.Second}

// healthy reports whether every running node's /healthz says ok, and every node runs.
func (c *natsCluster) healthy() (bool, string) {
	for _, n := range c.nodes {
		if !n.proc.running() {
			return false, n.name + " is down"
		}
		resp, err := monitor.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.httpPort))
		if err != nil {
			return false, n.name + ": " + err.Error()
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, n.name + ": " + strings.TrimSpace(string(body))
		}
	}
	return true, ""
}

// waitHealthy waits until healthy holds or ctx ends.
func (c *natsCluster) waitHealthy(ctx context.Context, within time.Duration) error {
	return waitUntil(ctx, within, func() (bool, string) { return c.healthy() })
}

// waitUntil polls cond every 100 ms until it holds, within passes (an error with its last
// complaint) or ctx ends.
func waitUntil(ctx context.Context, within time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %s", within, why)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// connect opens the soak's own connection to the cluster: it fails over forever and says
// nothing of its own (the timeline says what the soak did).
func connect(urls, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(urls, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond), nats.Timeout(3*time.Second),
		nats.RetryOnFailedConnect(true), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// streamFor is the stream that stores subject (found through JetStream, not by name).
func streamFor(ctx context.Context, js jetstream.JetStream, subject string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return js.StreamNameBySubject(ctx, subject)
}

// leaderOf is the server name of stream's leader.
func leaderOf(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", errors.New("no leader")
	}
	return info.Cluster.Leader, nil
}

// consumerStates lists every durable consumer of every stream.
func consumerStates(ctx context.Context, js jetstream.JetStream) ([]ConsumerState, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []ConsumerState
	names := js.StreamNames(ctx)
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	for _, sn := range streams {
		s, err := js.Stream(ctx, sn)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", sn, err)
		}
		infos := s.ListConsumers(ctx)
		for ci := range infos.Info() {
			if ci.Config.Durable == "" {
				continue // ordered and ephemeral consumers (the review page's reader) come and go
			}
			out = append(out, ConsumerState{
				Stream: sn, Name: ci.Name, Pending: ci.NumPending, AckPending: uint64(ci.NumAckPending),
				Redelivered: ci.NumRedelivered, Paused: ci.Paused, FilterSubjects: append([]string{ci.Config.FilterSubject}, ci.Config.FilterSubjects...),
				WaitingPulls: ci.NumWaiting, Replicas: ci.Config.Replicas,
			})
		}
		if err := infos.Err(); err != nil {
			return nil, fmt.Errorf("consumers of %s: %w", sn, err)
		}
	}
	return out, nil
}

// leftovers lists the work-queue streams that still hold messages.
func leftovers(ctx context.Context, js jetstream.JetStream) ([]Leftover, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []Leftover
	l := js.ListStreams(ctx)
	for si := range l.Info() {
		if si.Config.Retention == jetstream.WorkQueuePolicy && si.State.Msgs > 0 {
			out = append(out, Leftover{Stream: si.Config.Name, Msgs: si.State.Msgs, FirstSeq: si.State.FirstSeq})
		}
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out, nil
}
