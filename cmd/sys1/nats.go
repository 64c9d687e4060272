package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

// defaultClientURL is where client commands look when SYS1_NATS_URL is unset: the embedded
// server a `sys1 worker` starts on a developer's machine, at its SYS1_NATS_LISTEN address
// (127.0.0.1:4222 by default; a wildcard host is reached on 127.0.0.1). So one environment
// serves the worker and the commands that talk to it.
func defaultClientURL() string {
	listen := strings.TrimSpace(os.Getenv("SYS1_NATS_LISTEN"))
	host, port, err := net.SplitHostPort(listen)
	if listen == "" || err != nil || port == "" || port == "0" || port == "-1" {
		return "nats://127.0.0.1:4222"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, port)
}

// dialClient connects a client command (decide, bench, sink) with the worker's connection
// settings (SYS1_NATS_*). Unlike the worker it never starts an embedded server, and it gives
// up after a few seconds (clientConnectWait) instead of waiting for NATS to appear.
func dialClient(ctx context.Context, name string, logTo io.Writer) (*natsconn.Conn, error) {
	return dialClientInbox(ctx, name, logTo, "")
}

// clientConnectWait is how long an interactive client command waits for NATS at start.
const clientConnectWait = 5 * time.Second

// dialClientInbox is dialClient with the inbox prefix to use when SYS1_NATS_INBOX_PREFIX is
// unset ("": nats.go's _INBOX).
func dialClientInbox(ctx context.Context, name string, logTo io.Writer, defaultInbox string) (*natsconn.Conn, error) {
	return dialClientWait(ctx, name, logTo, defaultInbox, clientConnectWait)
}

// dialClientWait is dialClientInbox waiting up to wait for NATS (a long-running command such
// as sys1 batch run rides out a restart or a failover at its start as it does later).
func dialClientWait(ctx context.Context, name string, logTo io.Writer, defaultInbox string, wait time.Duration) (*natsconn.Conn, error) {
	cfg := natsconn.DefaultConfig()
	// Set before validation: a client's settings are those of a remote server (creds, nkey,
	// TLS are fine; the embedded server's SYS1_NATS_LISTEN and SYS1_DATA_DIR do not apply).
	cfg.URL = defaultClientURL()
	if err := loadConfig(&cfg); err != nil {
		return nil, err
	}
	if cfg.URL == "" {
		cfg.URL = defaultClientURL()
	}
	if cfg.InboxPrefix == "" {
		cfg.InboxPrefix = defaultInbox
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	log := zerolog.New(logTo).Level(zerolog.WarnLevel)
	conn, err := natsconn.Connect(cctx, cfg, name, log)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", natsconn.RedactURLs(cfg.URL), err)
	}
	return conn, nil
}

// openTopology reads the JetStream names (SYS1_*_STREAM, …) and connects as a client. On
// failure it has reported why and conn is nil; code is the exit status.
func openTopology(ctx context.Context, name string, stderr io.Writer) (topology.Config, *natsconn.Conn, int) {
	topo := topology.Default()
	if err := loadConfig(&topo); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return topo, nil, exitUsage
	}
	conn, err := dialClient(ctx, name, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return topo, nil, exitUsage
	}
	return topo, conn, exitOK
}
