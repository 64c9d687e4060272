package soak

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// soakCallers are the callers whose records and labels the checks read.
var soakCallers = []string{CallerPlain, CallerBudget, CallerCache, CallerHold, CallerBatch}

func callerList() string {
	q := make([]string, len(soakCallers))
	for i, c := range soakCallers {
		q[i] = "'" + c + "'"
	}
	return strings.Join(q, ", ")
}

// countRows is how many run records and labels of the soak's callers ClickHouse holds under
// FINAL.
func (s *soak) countRows(ctx context.Context) (runs, labels int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var n, m uint64
	if err = s.ch.QueryRow(ctx, "SELECT count() FROM `"+s.db+"`.runs FINAL WHERE caller IN ("+callerList()+")").Scan(&n); err != nil {
		return 0, 0, err
	}
	err = s.ch.QueryRow(ctx, "SELECT count() FROM `"+s.db+"`.labels FINAL WHERE caller IN ("+callerList()+")").Scan(&m)
	return int(n), int(m), err
}

// observe gathers everything the checks judge, once the fleet has drained (or the drain ran
// out).
func (s *soak) observe(ctx context.Context) Observations {
	o := Observations{Start: s.start, End: time.Now(), Timeline: s.tl}
	o.Requests, o.SentLabels = s.load.snapshot()
	o.Calls = s.model.snapshot()
	for _, w := range s.workers {
		o.Workers = append(o.Workers, w.incarnations()...)
	}
	for _, n := range s.nats.nodes {
		o.Processes = append(o.Processes, n.proc.incarnations()...)
	}
	for _, p := range s.others {
		o.Processes = append(o.Processes, p.incarnations()...)
	}
	o.Budgets = []Budget{{Caller: CallerBudget, Limit: s.budget}}
	if s.batches != nil {
		o.Batches = s.batches.snapshot()
	}
	// Consumers first, while the collectors still run: theirs must be drained too.
	cs, err := consumerStates(ctx, s.js)
	if err != nil {
		o.Consumers = []ConsumerState{{Stream: "(all)", Name: "(all)", Err: err.Error()}}
	} else {
		o.Consumers = cs
	}
	if o.Leftovers, err = leftovers(ctx, s.js); err != nil {
		o.Consumers = append(o.Consumers, ConsumerState{Stream: "(work queues)", Name: "(streams)", Err: err.Error()})
	}
	s.stopCollectors()
	s.collecting.Wait()
	o.Replies = s.replies.snapshot()
	o.Labels = s.labels.snapshot()

	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rows, err := s.ch.Query(rctx, "SELECT run_id, caller, status FROM `"+s.db+"`.runs FINAL WHERE caller IN ("+callerList()+")")
	if err == nil {
		for rows.Next() {
			var r Row
			if err = rows.Scan(&r.RunID, &r.Caller, &r.Status); err != nil {
				break
			}
			o.Rows = append(o.Rows, r)
		}
		rows.Close()
	}
	if err == nil {
		rows, err = s.ch.Query(rctx, "SELECT run_id, question, value, source FROM `"+s.db+"`.labels FINAL WHERE caller IN ("+callerList()+")")
		if err == nil {
			for rows.Next() {
				var r LabelRow
				if err = rows.Scan(&r.RunID, &r.Question, &r.Value, &r.Source); err != nil {
					break
				}
				o.LabelRows = append(o.LabelRows, r)
			}
			rows.Close()
		}
	}
	o.RowsRead = err == nil
	if err != nil {
		s.tl.Add(Event{What: "cannot read ClickHouse", Detail: err.Error()})
	}
	return o
}

func (s *soak) stats(o Observations) Stats {
	st := Stats{Requests: len(o.Requests), Replies: len(o.Replies), Calls: len(o.Calls), Faults: map[string]int{},
		ProducerLabels: len(o.SentLabels), PublishRetries: s.load.retries.Load(), ReviewerConflicts: int(s.reviewer.conflicts.Load())}
	for _, r := range o.Requests {
		if r.Acked() {
			st.Acked++
		}
	}
	for _, c := range o.Calls {
		if c.Answered {
			st.AnsweredCalls++
		}
	}
	for _, b := range o.Batches {
		st.Batches++
		st.BatchItems += len(b.Items)
		st.BatchRestarts += b.Restarts
	}
	for _, l := range o.Labels {
		if l.Source == "review" {
			st.ReviewLabels++
		}
	}
	for _, e := range s.tl.Events() {
		if e.What == "kill" || e.What == "cut clickhouse" || e.What == "pause the fleet" || e.What == "slow model" || e.What == "failing model" {
			k := e.What
			if e.What == "kill" {
				k = "kill " + kindOfProcess(e.Target)
			}
			st.Faults[k]++
		}
	}
	return st
}

func kindOfProcess(name string) string {
	switch {
	case strings.HasPrefix(name, "w"):
		return "worker"
	case strings.HasPrefix(name, "n"):
		return "nats node"
	case strings.HasPrefix(name, "batch"):
		return "batch client"
	}
	return name
}

// teardown stops the fleet (the workers first, so nothing they hold is lost, NATS last), and
// removes what the soak made unless asked to keep it.
func (s *soak) teardown() {
	if s.stopCollectors != nil {
		s.stopCollectors()
		s.collecting.Wait()
	}
	if s.batches != nil {
		s.batches.mu.Lock()
		cur := s.batches.cur
		s.batches.mu.Unlock()
		if cur != nil {
			cur.stop(10 * time.Second)
		}
	}
	for _, w := range s.workers {
		w.stop(30 * time.Second)
	}
	for _, p := range s.others {
		p.stop(15 * time.Second)
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.nats != nil {
		for _, n := range s.nats.nodes {
			if n.proc != nil {
				n.proc.stop(15 * time.Second)
			}
		}
	}
	if s.model != nil {
		s.model.close()
	}
	if s.proxy != nil {
		s.proxy.close()
	}
	if s.ch != nil {
		if !s.o.Keep && s.db != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = s.ch.Exec(ctx, "DROP DATABASE IF EXISTS `"+s.db+"`")
			cancel()
		}
		_ = s.ch.Close()
	}
	if !s.o.Keep && s.o.Dir == "" && s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// String is a one-line summary of the figures.
func (st Stats) String() string {
	return fmt.Sprintf("%d requests (%d acknowledged), %d replies, %d model calls (%d answered), %d batch items in %d batches (%d resumed), %d producer labels, %d review labels",
		st.Requests, st.Acked, st.Replies, st.Calls, st.AnsweredCalls, st.BatchItems, st.Batches, st.BatchRestarts, st.ProducerLabels, st.ReviewLabels)
}
