package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/budget"
	"github.com/sys1hq/sys1/worker/fleet"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "status", summary: "every replica's health, the queues and the pause state", run: runStatus})
}

const statusUsage = `usage: sys1 status [--json] [--wait 2s]

Asks every worker replica over NATS (micro service sys1, subject sys1.svc.health) and prints
one line per replica — its status (ok, degraded, down, paused), providers and in-flight
work — then the shared consumers' pending and ack-pending counts and the pause state.
Exit status: 0 when every replica is ok or degraded, 1 when one is down or none answered, 2
on usage or connection errors. NATS settings as for sys1 decide (SYS1_NATS_*).
`

// fleetStatus is what sys1 status --json prints.
type fleetStatus struct {
	Replicas  []worker.Health        `json:"replicas"`
	Consumers []worker.ConsumerState `json:"consumers"`
	Paused    *worker.PauseState     `json:"paused"`
	// Callers is each limited caller's use against its limits (SYS1_LIMITS_FILE), today.
	Callers []callerUse `json:"callers"`
}

// callerUse is one caller's use of one limit.
type callerUse struct {
	Caller   string     `json:"caller"`
	Rule     string     `json:"rule"`
	Limit    string     `json:"limit"`
	Max      float64    `json:"max"`
	Used     float64    `json:"used"`
	ResetsAt *time.Time `json:"resets_at,omitempty"`
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, statusUsage); fs.PrintDefaults() }
	asJSON := fs.Bool("json", false, "print JSON")
	wait := fs.Duration("wait", 2*time.Second, "how long to wait for the replicas' answers")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 || *wait <= 0 {
		fs.Usage()
		return exitUsage
	}
	topo, conn, code := openTopology(ctx, "sys1 status", stderr)
	if conn == nil {
		return code
	}
	defer conn.Close()
	answers, err := fleet.Ask(ctx, conn.NC, wire.HealthSubject, *wait)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 status: %v\n", err)
		return exitUsage
	}
	st := fleetStatus{Replicas: []worker.Health{}, Consumers: []worker.ConsumerState{}, Callers: []callerUse{}}
	for _, a := range answers {
		var h worker.Health
		if err := json.Unmarshal(a, &h); err != nil {
			fmt.Fprintf(stderr, "sys1 status: a replica answered something that is not health: %v\n", err)
			continue
		}
		st.Replicas = append(st.Replicas, h)
	}
	sort.Slice(st.Replicas, func(i, j int) bool { return st.Replicas[i].Replica < st.Replicas[j].Replica })
	// The queues and pauses as JetStream sees them now, not as the replicas last read them.
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st.Consumers, _ = worker.QueueState(qctx, conn.JS, topo) // an error is said in the entries
	cancel()
	pauses, err := readPauses(ctx, conn, topo)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 status: %v\n", err)
	}
	for i, c := range st.Consumers {
		lane := topology.Lane(c.Lane)
		switch c.Name {
		case topo.WorkerConsumer:
			lane = topology.LaneInteractive
		case topo.BatchConsumer:
			lane = topology.LaneBatch
		}
		if p, ok := pauses[lane]; ok {
			st.Consumers[i].Paused = describedPause(p)
		}
	}
	if p, ok := pauses[topology.LaneInteractive]; ok {
		st.Paused = describedPause(p)
	}
	if uses, err := callerUses(ctx, conn, topo, *wait); err != nil {
		fmt.Fprintf(stderr, "sys1 status: caller limits: %v\n", err)
	} else {
		st.Callers = uses
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	} else {
		printStatus(stdout, st)
	}
	if len(st.Replicas) == 0 {
		if !*asJSON {
			fmt.Fprintln(stderr, "sys1 status: no replica answered (is any sys1 worker connected to this NATS?)")
		}
		return exitFailed
	}
	for _, h := range st.Replicas {
		if h.Status == worker.HealthDown {
			return exitFailed
		}
	}
	return exitOK
}

// callerUses reads the limits the replicas enforce (their capabilities) and every counted
// caller's use against them (KV sys1-limits).
func callerUses(ctx context.Context, conn *natsconn.Conn, topo topology.Config, wait time.Duration) ([]callerUse, error) {
	caps, err := fleet.Ask(ctx, conn.NC, wire.CapabilitiesSubject, wait)
	if err != nil || len(caps) == 0 {
		return []callerUse{}, err
	}
	var c worker.Capabilities
	if err := json.Unmarshal(caps[0], &c); err != nil {
		return nil, fmt.Errorf("a replica's capabilities: %w", err)
	}
	if len(c.CallerLimits) == 0 {
		return []callerUse{}, nil // nobody is limited
	}
	lim := &limits.Limits{}
	for _, cl := range c.CallerLimits {
		lim.Rules = append(lim.Rules, cl.Rule())
	}
	kv, err := conn.JS.KeyValue(ctx, topo.LimitsBucket)
	if err != nil {
		return nil, fmt.Errorf("limits bucket %s: %w", topo.LimitsBucket, err)
	}
	b, err := budget.New(budget.Config{KV: kv})
	if err != nil {
		return nil, err
	}
	defer b.Close()
	report, err := b.Report(ctx, lim)
	if err != nil {
		return nil, err
	}
	out := []callerUse{}
	for _, u := range report {
		for _, use := range u.Uses {
			cu := callerUse{Caller: u.Caller, Rule: u.Rule, Limit: use.Kind.Label(), Max: use.Limit, Used: use.Used}
			if !use.ResetsAt.IsZero() {
				r := use.ResetsAt
				cu.ResetsAt = &r
			}
			out = append(out, cu)
		}
	}
	return out, nil
}

// statusLegend explains the replica table's counts: two say what a replica holds at this
// moment (so an idle fleet shows 0 however busy it was), two what it did since it started.
const statusLegend = "(RUNNING: messages in hand now; CALLING: provider calls running now; RUNS, CALLS: runs finished and provider calls made since the replica started)"

func printStatus(out io.Writer, st fleetStatus) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tSTATUS\tVERSION\tPROVIDERS\tRUNNING\tCALLING\tRUNS\tCALLS")
	for _, h := range st.Replicas {
		provs := make([]string, 0, len(h.Providers))
		for _, p := range h.Providers {
			state := "up"
			if !p.OK {
				state = "down"
			}
			if p.Breaker != "" && p.Breaker != "closed" {
				state += "/" + string(p.Breaker)
			}
			provs = append(provs, p.Name+" "+state+routesNotClosed(p.Routes.Counts))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", h.Replica, h.Status, h.Version, strings.Join(provs, ", "),
			h.InFlight.Messages, h.InFlight.ProviderCalls, h.Totals.Runs, h.Totals.ProviderCalls)
	}
	_ = tw.Flush()
	if len(st.Replicas) > 0 {
		fmt.Fprintln(out, statusLegend)
	}
	printFull(out, st.Replicas)
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tCALLERS\tPENDING\tACK PENDING\tREDELIVERED\tPAUSED")
	for _, c := range st.Consumers {
		callers := "-"
		if c.Lane != "" {
			callers = strconv.Itoa(c.Callers)
		}
		if c.Error != "" {
			fmt.Fprintf(tw, "%s\t?\t?\t?\t?\t%s\n", c.Name, c.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", c.Name, callers, c.Pending, c.AckPending, c.Redelivery, describePause(c.Paused))
	}
	_ = tw.Flush()
	if len(st.Callers) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALLER\tRULE\tLIMIT\tUSED\tOF\tRESETS")
	for _, c := range st.Callers {
		resets := "-"
		if c.ResetsAt != nil {
			resets = c.ResetsAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Caller, c.Rule, c.Limit, strconv.FormatFloat(c.Used, 'f', -1, 64), strconv.FormatFloat(c.Max, 'f', -1, 64), resets)
	}
	_ = tw.Flush()
}

// printFull names the streams some replica finds full (refusing new messages), with the
// variable of each one's limit.
func printFull(out io.Writer, replicas []worker.Health) {
	seen := map[string]string{}
	for _, h := range replicas {
		for _, name := range h.Full {
			seen[name] = ""
			for _, u := range h.Storage {
				if u.Name == name && u.Variable != "" {
					seen[name] = " (raise " + u.Variable + ")"
				}
			}
		}
	}
	if len(seen) == 0 {
		return
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name+seen[name])
	}
	slices.Sort(names)
	fmt.Fprintf(out, "\nFULL, refusing new messages: %s\n", strings.Join(names, ", "))
}

func describePause(p *worker.PauseState) string {
	if p == nil {
		return "no"
	}
	s := "until resumed"
	if p.Until != nil {
		s = "until " + p.Until.Format(time.RFC3339)
	}
	if p.Reason != "" {
		s += " (" + p.Reason + ")"
	}
	return s
}

// routesNotClosed says how many of a provider's routes (models on it) are not closed, e.g.
// " (routes: 1 open, 2 absent)"; "" when all are closed. sys1.svc.health names them.
func routesNotClosed(c chain.RouteCounts) string {
	var parts []string
	for _, n := range []struct {
		count int
		state string
	}{{c.Open, "open"}, {c.HalfOpen, "half-open"}, {c.Absent, "absent"}} {
		if n.count > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n.count, n.state))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (routes: " + strings.Join(parts, ", ") + ")"
}
