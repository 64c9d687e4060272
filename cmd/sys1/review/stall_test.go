package review

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// A reader that stops delivering while the review stream holds newer items is restarted
// after the last item it read, and the page shows the new item. The stall is real: the
// reader's consumer is paused on the server, which then delivers nothing and reports no
// error — what nats.go's ordered consumer does after the server its connection was on died.
func TestItemReaderResumesAfterStall(t *testing.T) {
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.StallCheck = 100 * time.Millisecond }})
	first := ticketItem("run-stall-1")
	h.publish(first)
	h.waitIndexed(first.ID)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.cfg.Topology.ReviewStream)
	if err != nil {
		t.Fatal(err)
	}
	paused := 0
	for name := range s.ConsumerNames(ctx).Name() {
		if _, err := h.js.PauseConsumer(ctx, h.cfg.Topology.ReviewStream, name, time.Now().Add(time.Hour)); err != nil {
			t.Fatalf("pause %s: %v", name, err)
		}
		paused++
	}
	if paused == 0 {
		t.Fatal("no consumer reads the review stream")
	}

	second := ticketItem("run-stall-2")
	h.publish(second)
	// Well within the minute nats.go's own heartbeat check would take to notice anything.
	natstest.WaitFor(t, 5*time.Second, "the item published during the stall in the index", func() bool {
		_, _, ok := h.rs.idx.item(second.ID)
		return ok
	})
	if !strings.Contains(h.logs.String(), "the reader stalled; reading on from the last item seen") {
		t.Errorf("no stall was logged:\n%s", h.logs.String())
	}
	if _, _, ok := h.rs.idx.item(first.ID); !ok {
		t.Error("the item read before the stall left the index")
	}
	if got := h.rs.idx.malformed.Load(); got != 0 {
		t.Errorf("%d items counted malformed", got)
	}
}
