package soak

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// FaultKind is one kind of trouble the soak makes.
type FaultKind string

// The faults. Process faults (a track of their own, one at a time, so at most one NATS node is
// down unless the whole cluster crashes) and environment faults (another track, overlapping the
// first) combine.
const (
	// KillWorker SIGKILLs a worker and starts it again after Down.
	KillWorker FaultKind = "kill worker"
	// KillNATS SIGKILLs a NATS node — the one leading Role when Role is set — and starts it
	// again after Down.
	KillNATS FaultKind = "kill nats node"
	// KillNATSAndWorker is both at once: the worker is started again while the node is down.
	KillNATSAndWorker FaultKind = "kill nats node and worker"
	// CrashCluster SIGKILLs every NATS node at once and starts them again after Down: a
	// whole-cluster crash (a power loss would also drop what the kernel had not written; a
	// killed process cannot simulate that).
	CrashCluster FaultKind = "crash the nats cluster"
	// CutClickHouse refuses and cuts every connection to ClickHouse for Down.
	CutClickHouse FaultKind = "cut clickhouse"
	// PauseFleet pauses the fleet (sys1 pause) for Down.
	PauseFleet FaultKind = "pause the fleet"
	// SlowModel makes every model call take Latency longer for Down.
	SlowModel FaultKind = "slow model"
	// FailModel makes every model call fail (Failure says how) for Down.
	FailModel FaultKind = "failing model"
)

// Leader roles a NATS kill can aim at: the node leading that stream when the fault starts.
const (
	RoleRequests = "leader of the request stream"
	RoleGate     = "leader of the run-id gate's bucket"
	RoleBudgets  = "leader of the budgets' bucket"
)

// Failures a failing model answers with.
const (
	FailUnavailable = "503 with Retry-After"
	FailError       = "500"
	FailDrop        = "dropped connection"
	FailHang        = "hang until the worker's timeout"
)

// Fault is one planned fault.
type Fault struct {
	// At is when it starts, from the soak's start.
	At   time.Duration
	Kind FaultKind
	// Worker is the worker slot (1…) a worker fault kills; Node the NATS node (1…) a node
	// fault kills when Role is empty.
	Worker, Node int
	Role         string
	// Down is how long the process stays down, or the condition lasts.
	Down time.Duration
	// Latency is what SlowModel adds; Failure what FailModel answers.
	Latency time.Duration
	Failure string
}

func (f Fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%s %s", f.At.Truncate(100*time.Millisecond), f.Kind)
	switch f.Kind {
	case KillWorker:
		fmt.Fprintf(&b, " w%d", f.Worker)
	case KillNATS, KillNATSAndWorker:
		if f.Role != "" {
			b.WriteString(" (" + f.Role + ")")
		} else {
			fmt.Fprintf(&b, " n%d", f.Node)
		}
		if f.Kind == KillNATSAndWorker {
			fmt.Fprintf(&b, " and w%d", f.Worker)
		}
	case SlowModel:
		fmt.Fprintf(&b, " +%s a call", f.Latency)
	case FailModel:
		b.WriteString(": " + f.Failure)
	}
	fmt.Fprintf(&b, " for %s", f.Down.Truncate(100*time.Millisecond))
	return b.String()
}

// Plan is a soak's faults, in start order.
type Plan struct {
	Seed   uint64
	Faults []Fault
}

// PlanOptions shape a plan.
type PlanOptions struct {
	Seed     uint64
	Duration time.Duration // of the load; faults start after a warm-up and end before it does
	Workers  int           // worker slots 1…Workers
	Nodes    int           // NATS nodes 1…Nodes
	// Kinds limits the faults to these; empty means all.
	Kinds []FaultKind
}

// NewPlan draws a plan from opt.Seed: the same options give the same plan, so a run replays
// with --seed. Each track first takes every kind it has once, in a random order (so even a
// short soak combines them all), then draws kinds at random, with random gaps (process faults
// every ~6 s, as in production's worst hours), until the fault window ends.
func NewPlan(opt PlanOptions) Plan {
	rng := rand.New(rand.NewPCG(opt.Seed, opt.Seed^0x5eed2024))
	allowed := func(k FaultKind) bool {
		if len(opt.Kinds) == 0 {
			return true
		}
		for _, x := range opt.Kinds {
			if x == k {
				return true
			}
		}
		return false
	}
	// Faults start after a warm-up and end by 85% of the load, so the fleet has time to
	// recover and answer everything while the load still runs.
	warm := min(10*time.Second, opt.Duration/10)
	end := opt.Duration * 85 / 100
	short := opt.Duration < 3*time.Minute
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	p := Plan{Seed: opt.Seed}

	// Process track: one at a time, each followed by a gap.
	procKinds := []FaultKind{KillNATSAndWorker, CrashCluster, KillWorker, KillNATS}
	roles := []string{RoleRequests, RoleGate, RoleBudgets, ""}
	draw := func(k FaultKind) Fault {
		f := Fault{Kind: k}
		switch k {
		case KillWorker:
			f.Worker = 1 + rng.IntN(opt.Workers)
			// Often started again at once: a replacement that comes up while NATS is busy.
			f.Down = between(200*time.Millisecond, 5*time.Second)
			if short {
				f.Down = between(200*time.Millisecond, 3*time.Second)
			}
		case KillNATS, KillNATSAndWorker:
			f.Role = roles[rng.IntN(len(roles))]
			if f.Role == "" {
				f.Node = 1 + rng.IntN(opt.Nodes)
			}
			if short {
				f.Down = between(2*time.Second, 5*time.Second)
			} else {
				f.Down = between(2*time.Second, 20*time.Second)
			}
			if k == KillNATSAndWorker {
				f.Worker = 1 + rng.IntN(opt.Workers)
			}
		case CrashCluster:
			f.Down = between(time.Second, 6*time.Second)
			if short {
				f.Down = between(time.Second, 4*time.Second)
			}
		}
		return f
	}
	var must []FaultKind
	for _, k := range procKinds {
		if allowed(k) && opt.Workers > 0 {
			must = append(must, k)
		}
	}
	rng.Shuffle(len(must), func(i, j int) { must[i], must[j] = must[j], must[i] })
	// After the first pass, kills of one process are the common case and whole-cluster
	// crashes rare.
	weights := map[FaultKind]int{KillWorker: 35, KillNATS: 35, KillNATSAndWorker: 20, CrashCluster: 10}
	t := warm
	for i := 0; len(must) > 0; i++ {
		var k FaultKind
		if i < len(must) {
			k = must[i]
		} else if k = weighted(rng, must, weights); k == "" {
			break
		}
		f := draw(k)
		f.At = t
		if t+f.Down > end {
			break
		}
		p.Faults = append(p.Faults, f)
		// The next one after this one has recovered (a restarted node catching up takes a
		// few seconds more) and a gap.
		recover := f.Down
		if k != KillWorker {
			recover += 3 * time.Second
		}
		if short {
			t += recover + between(time.Second, 4*time.Second)
		} else {
			t += recover + between(2*time.Second, 8*time.Second)
		}
	}

	// Environment track: overlapping the process faults.
	envKinds := []FaultKind{CutClickHouse, PauseFleet, SlowModel, FailModel}
	failures := []string{FailUnavailable, FailError, FailDrop, FailHang}
	var envMust []FaultKind
	for _, k := range envKinds {
		if allowed(k) {
			envMust = append(envMust, k)
		}
	}
	rng.Shuffle(len(envMust), func(i, j int) { envMust[i], envMust[j] = envMust[j], envMust[i] })
	t = warm + between(0, 3*time.Second)
	for i := 0; len(envMust) > 0; i++ {
		k := FaultKind("")
		if i < len(envMust) {
			k = envMust[i]
		} else {
			k = envMust[rng.IntN(len(envMust))]
		}
		f := Fault{Kind: k, At: t}
		switch k {
		case CutClickHouse:
			f.Down = between(5*time.Second, 30*time.Second)
			if short {
				f.Down = between(5*time.Second, 10*time.Second)
			}
		case PauseFleet:
			f.Down = between(3*time.Second, 15*time.Second)
			if short {
				f.Down = between(3*time.Second, 6*time.Second)
			}
		case SlowModel:
			f.Down = between(5*time.Second, 20*time.Second)
			f.Latency = between(500*time.Millisecond, 3*time.Second).Round(100 * time.Millisecond)
			if short {
				f.Down = between(3*time.Second, 8*time.Second)
			}
		case FailModel:
			f.Down = between(3*time.Second, 15*time.Second)
			f.Failure = failures[rng.IntN(len(failures))]
			if short {
				f.Down = between(2*time.Second, 5*time.Second)
			}
		}
		if t+f.Down > end {
			break
		}
		p.Faults = append(p.Faults, f)
		if short {
			t += f.Down + between(time.Second, 3*time.Second)
		} else {
			t += f.Down + between(3*time.Second, 15*time.Second)
		}
	}
	sortFaults(p.Faults)
	return p
}

func weighted(rng *rand.Rand, kinds []FaultKind, weights map[FaultKind]int) FaultKind {
	total := 0
	for _, k := range kinds {
		total += weights[k]
	}
	if total == 0 {
		return ""
	}
	n := rng.IntN(total)
	for _, k := range kinds {
		if n < weights[k] {
			return k
		}
		n -= weights[k]
	}
	return kinds[len(kinds)-1]
}

func sortFaults(fs []Fault) {
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && fs[j].At < fs[j-1].At; j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
}

// Counts is how many faults of each kind the plan has.
func (p Plan) Counts() map[FaultKind]int {
	out := map[FaultKind]int{}
	for _, f := range p.Faults {
		out[f.Kind]++
	}
	return out
}

// ParseKinds reads a comma list of fault kinds by their short names (worker, nats,
// nats+worker, cluster, clickhouse, pause, slow, fail), or "all" or "none".
func ParseKinds(s string) ([]FaultKind, error) {
	names := map[string]FaultKind{
		"worker": KillWorker, "nats": KillNATS, "nats+worker": KillNATSAndWorker, "cluster": CrashCluster,
		"clickhouse": CutClickHouse, "pause": PauseFleet, "slow": SlowModel, "fail": FailModel,
	}
	switch strings.TrimSpace(s) {
	case "", "all":
		return nil, nil
	case "none":
		return []FaultKind{"none"}, nil
	}
	var out []FaultKind
	for _, n := range strings.Split(s, ",") {
		k, ok := names[strings.TrimSpace(n)]
		if !ok {
			return nil, fmt.Errorf("unknown fault %q (worker, nats, nats+worker, cluster, clickhouse, pause, slow, fail; all; none)", n)
		}
		out = append(out, k)
	}
	return out, nil
}
