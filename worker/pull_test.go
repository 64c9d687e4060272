package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// Short waiting pulls in a loop, as an idle replica with batch work in hand makes them
// (batchRecheck), while messages arrive at random moments: every message is received by a
// pull, none is left delivered-but-unread until AckWait. Bounding the pull by a context
// deadline instead of the server's expiry (the client stopped reading 2 ms after the server's
// expiry) left about one interactive request in 240 answered 30 s late under
// sys1 bench --self --batch; this test failed on that code in most runs.
func TestShortPullsStrandNoMessage(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PULL", Subjects: []string{"pull.>"}}); err != nil {
		t.Fatal(err)
	}
	// Several pullers side by side, as a replica's interactive, label and dead-letter loops
	// run, each on its own consumer and arrivals.
	const lanes, messages = 4, 300
	var wg sync.WaitGroup
	for lane := range lanes {
		subject := fmt.Sprintf("pull.%d", lane)
		// AckWait far beyond the test's deadline: a stranded message cannot come back in time.
		cons, err := js.CreateConsumer(ctx, "PULL", jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("w%d", lane), FilterSubject: subject,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute, MaxAckPending: 10000})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(lane)))
		gaps := make([]time.Duration, messages)
		for i := range gaps {
			// Around the pull's 20 ms, so arrivals land at every point of a pull's life, its
			// last milliseconds included.
			gaps[i] = time.Duration(rng.Int64N(int64(2 * batchRecheck)))
		}
		wg.Go(func() {
			for i, gap := range gaps {
				time.Sleep(gap) // the arrival process under test, not synchronisation
				if _, err := js.Publish(ctx, subject, []byte(strconv.Itoa(i))); err != nil {
					t.Errorf("publish %s %d: %v", subject, i, err)
					return
				}
			}
		})
		wg.Go(func() {
			seen := make(map[string]bool, messages)
			deadline := time.Now().Add(time.Duration(messages)*2*batchRecheck + 5*time.Second)
			for len(seen) < messages && time.Now().Before(deadline) {
				mb, err := pullWaiting(cons, 1, batchRecheck)
				if err != nil {
					t.Errorf("pull %s: %v", subject, err)
					return
				}
				for m := range mb.Messages() {
					seen[string(m.Data())] = true
					if err := m.Ack(); err != nil {
						t.Errorf("ack %s: %v", subject, err)
					}
				}
			}
			if len(seen) != messages {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Errorf("consumer info %s: %v", subject, err)
					return
				}
				t.Errorf("%s: received %d of %d messages; %d delivered and unacknowledged (stranded until AckWait)",
					subject, len(seen), messages, info.NumAckPending)
			}
		})
	}
	wg.Wait()
}
