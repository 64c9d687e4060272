package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

// A producer asks one question and waits for the answer. Use the inbox prefix your NATS user
// may read (deploy/nats allows _INBOX.<user>.> only); without one, nats.go uses _INBOX.
func ExampleClient_Decide() {
	url, stop := startSys1() // a NATS server and one worker (on the simulator), as in production
	defer stop()

	nc, err := nats.Connect(url, nats.CustomInboxPrefix("_INBOX.billing"))
	if err != nil {
		fmt.Println("connect:", err)
		return
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}

	body := []byte(`{"state": {"text": "I was charged twice"},
	  "questions": {"refund": {"type": "noul", "instructions": "Does the customer want money back?"}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := c.Decide(ctx, client.Request{Caller: "billing", RunID: "ticket-48213", Body: body})
	switch {
	case errors.Is(err, client.ErrNoStream):
		fmt.Println("no sys1 worker has ever run against this NATS")
		return
	case err != nil: // transport trouble: nothing was decided
		fmt.Println("decide:", err)
		return
	}
	if reply.Status != contract.StatusSuccess {
		fmt.Println("failed:", reply.Error.Code) // e.g. SYS1_INVALID_INPUT, SYS1_PROVIDER_BUSY
		return
	}
	fmt.Println(reply.RunID, reply.Status, reply.Result.Provider, reply.Header.Get(wire.HeaderStatus))
	// Output: ticket-48213 success simulator success
}

// startSys1 runs an embedded NATS server and one worker replica on the simulator, the way
// `SYS1_PROVIDER=simulator sys1 worker` does, and returns the server's URL.
func startSys1() (string, func()) {
	dir, err := os.MkdirTemp("", "sys1-example")
	if err != nil {
		panic(err)
	}
	srv, err := natsconn.StartEmbedded(natsconn.EmbeddedOptions{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := auth.New(ctx, auth.DefaultConfig(), zerolog.Nop())
	if err != nil {
		panic(err)
	}
	w, err := worker.New(ctx, worker.Config{Concurrency: 2, ConcurrencyMode: "fixed", MaxDeliver: 2, ShutdownGrace: time.Second, FetchBatch: 2, RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond},
		worker.Options{NC: nc, JS: js, Topology: topology.Default(), Provider: simulator.New(0),
			ModelPolicy: contract.Policy{DefaultModel: "nimble"}, Auth: a, Logger: zerolog.Nop(), FetchWait: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	return srv.ClientURL(), func() {
		cancel()
		<-done
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}
