package natsconn

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// freezableProxy forwards TCP to target until frozen; then it keeps the connections open but
// passes nothing, as a NATS node lost without a reset (a dead host, a partition) would.
type freezableProxy struct {
	ln     net.Listener
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezableProxy(t *testing.T, target string) *freezableProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezableProxy{ln: ln}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go p.pipe(in, out)
			go p.pipe(out, in)
		}
	}()
	return p
}

// pipe copies until frozen, then swallows everything.
func (p *freezableProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *freezableProxy) url() string { return "nats://" + p.ln.Addr().String() }

// A connection that goes silent (no reset, no data) is found stale within a few ping
// intervals and abandoned for a reconnect, instead of holding the replica idle for minutes.
func TestSilentConnectionIsFoundStale(t *testing.T) {
	srv := natstest.Start(t, func(o *server.Options) { o.JetStream = false })
	proxy := startFreezableProxy(t, srv.Addr().String())
	cfg := DefaultConfig()
	cfg.URL = proxy.url()
	cfg.PingInterval = 100 * time.Millisecond
	var logs natstest.Buffer
	c, err := Connect(context.Background(), cfg, "stale-test", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	proxy.frozen.Store(true)
	natstest.WaitFor(t, 10*time.Second, "the stale connection to be dropped", func() bool {
		return strings.Contains(logs.String(), "stale connection")
	})
	proxy.frozen.Store(false) // new connections through the proxy work again
	natstest.WaitFor(t, 10*time.Second, "a reconnect", func() bool { return c.NC.IsConnected() })
	if err := c.NC.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("after the reconnect: %v", err)
	}
}
