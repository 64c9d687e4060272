// Package natstest runs real nats-servers with JetStream inside tests: sys1's tests never mock
// NATS, they start one of these (a few milliseconds) with a fresh store per test.
package natstest

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Start runs a JetStream-enabled nats-server on a free loopback port, with its store in a
// temporary directory, shut down when the test ends. configure may adjust the options
// (credentials, max payload, ...) before the server starts.
func Start(tb testing.TB, configure ...func(*server.Options)) *server.Server {
	tb.Helper()
	opts := &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tb.TempDir(),
		NoLog: true, NoSigs: true,
		// Room to reserve sys1's stream limits (23.7 GiB) whatever the disk's free space: by
		// default a server reserves at most three quarters of it, and tests store megabytes.
		JetStreamMaxStore: 1 << 40,
	}
	for _, c := range configure {
		c(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		tb.Fatal("nats-server not ready within 10s")
	}
	tb.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// Connect opens a connection to srv (closed when the test ends) and its JetStream context.
func Connect(tb testing.TB, srv *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		tb.Fatalf("connect to %s: %v", srv.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// WaitFor polls cond every few milliseconds until it holds, failing the test if within passes
// first. It is for state a test can only observe by asking (a stream's contents, rows in
// ClickHouse, a log line), never a stand-in for a signal the code under test could give.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			tb.Fatalf("timed out after %s waiting for %s", within, what)
		case <-tick.C:
		}
	}
}

// Buffer is a goroutine-safe log sink: components log from their own goroutines (NATS
// callbacks, runs, refreshers) while the test reads what they wrote.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
