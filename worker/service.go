package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/pause"
	"github.com/sys1hq/sys1/worker/topology"
)

// Every replica registers the NATS micro service wire.ServiceName: `nats micro ls` lists the
// replicas, and its two endpoints (wire.HealthSubject, wire.CapabilitiesSubject) answer what a
// replica is and how it is doing. Every replica answers every request (no queue group), so one
// request gathers the whole fleet (sys1 status).

// Health statuses: the provider chain's (ok, degraded, down), or paused when the fleet's
// interactive consumer is paused.
const (
	HealthOK       = chain.StatusOK
	HealthDegraded = chain.StatusDegraded
	HealthDown     = chain.StatusDown
	HealthPaused   = "paused"
)

// Health is what sys1.svc.health answers.
type Health struct {
	Status        string             `json:"status"`
	Replica       string             `json:"replica"`
	Version       string             `json:"version"`
	SchemaVersion int                `json:"schema_version"`
	Providers     []chain.LinkHealth `json:"providers"`
	InFlight      InFlight           `json:"in_flight"`
	Totals        Totals             `json:"totals"`
	Consumers     []ConsumerState    `json:"consumers"`
	// Paused is set while the interactive consumer is paused.
	Paused *PauseState `json:"paused,omitempty"`
	// Full names the streams refusing new messages now (their byte limit, or the NATS
	// server's storage); with any, a status ok becomes degraded. Storage is every stream's
	// bytes and limit as last read.
	Full      []string      `json:"full,omitempty"`
	Storage   []StreamUsage `json:"storage"`
	CheckedAt time.Time     `json:"checked_at"`
}

// InFlight counts what a replica holds now: messages being processed, and of their provider
// calls those running at this moment (0 whenever the replica is idle, however busy it was).
type InFlight struct {
	Messages      int64 `json:"messages"`
	ProviderCalls int64 `json:"provider_calls"`
}

// Totals count what a replica did since it started: runs finished (succeeded and failed) and
// provider calls made (cache hits and replays make none).
type Totals struct {
	Runs          int64 `json:"runs"`
	ProviderCalls int64 `json:"provider_calls"`
}

// ConsumerState is a shared consumer as the replica last saw it (every SYS1_STATUS_INTERVAL).
type ConsumerState struct {
	// Name is the shared consumer's, or with fair share the lane's flow consumers'
	// (sys1-worker~*), whose figures are summed; Lane and Callers (those with messages
	// waiting or in hand) are set then.
	Name       string      `json:"name"`
	Lane       string      `json:"lane,omitempty"`
	Callers    int         `json:"callers,omitempty"`
	Pending    uint64      `json:"pending"`
	AckPending int         `json:"ack_pending"`
	Redelivery int         `json:"redelivered"`
	Paused     *PauseState `json:"paused,omitempty"`
	// Error says why the state is unknown, when it is.
	Error string `json:"error,omitempty"`
}

// PauseState is a consumer's pause: until when (nil: until resumed), why, since when.
type PauseState struct {
	Until  *time.Time `json:"until"`
	Reason string     `json:"reason,omitempty"`
	Since  string     `json:"since,omitempty"`
}

// Capabilities is what sys1.svc.capabilities answers: what this replica accepts and how it is
// set up. Never a secret.
type Capabilities struct {
	Replica        string            `json:"replica"`
	Version        string            `json:"version"`
	SchemaVersions map[string]int    `json:"schema_versions"`
	Chain          chain.Description `json:"chain"`
	DefaultModel   string            `json:"default_model"`
	AllowedModels  []string          `json:"allowed_models"`
	Limits         Limits            `json:"limits"`
	Concurrency    int               `json:"concurrency"`
	// ProviderLatencyMS is the recent latency of this replica's successful provider calls (a
	// moving average), 0 before the first.
	ProviderLatencyMS float64 `json:"provider_latency_ms"`
	MaxDeliver        int     `json:"max_deliver"`
	ConsumerMax       int     `json:"consumer_max_deliver"`
	AuthMode          string  `json:"auth_mode"`
	// Calibration lists the temperature fits this replica applies.
	Calibration []FitSummary `json:"calibration"`
	// CallerLimits are the rules of SYS1_LIMITS_FILE in force, first match wins (sys1 status
	// reads the counters against them).
	CallerLimits []CallerLimit `json:"caller_limits"`
	// Schemas are the JSON Schemas of the request, reply and run record (sys1 schema).
	Schemas map[string]json.RawMessage `json:"schemas"`
}

// CallerLimit is one rule of the limits file.
type CallerLimit struct {
	Name               string  `json:"name"`
	Caller             string  `json:"caller"`
	DecisionsPerMinute int64   `json:"decisions_per_minute,omitempty"`
	InputTokensPerDay  int64   `json:"input_tokens_per_day,omitempty"`
	USDPerDay          float64 `json:"usd_per_day,omitempty"`
	InFlight           int64   `json:"in_flight,omitempty"`
	CacheSeconds       int64   `json:"cache_seconds,omitempty"`
	CacheOff           bool    `json:"cache_off,omitempty"`
}

// Rule is the limits rule cl describes.
func (cl CallerLimit) Rule() limits.Rule {
	return limits.Rule{Name: cl.Name, Caller: cl.Caller, DecisionsPerMinute: cl.DecisionsPerMinute, InputTokensPerDay: cl.InputTokensPerDay,
		USDPerDay: cl.USDPerDay, InFlight: cl.InFlight, Cache: time.Duration(cl.CacheSeconds) * time.Second, CacheOff: cl.CacheOff}
}

// FitSummary is one loaded calibration fit.
type FitSummary struct {
	Model       string    `json:"model"`
	Caller      string    `json:"caller"`
	Question    string    `json:"question"`
	Temperature float64   `json:"temperature"`
	N           int       `json:"n"`
	FittedAt    time.Time `json:"fitted_at"`
	// Risk is the fit's risk threshold (sys1 calibrate --target-error --apply), which policy
	// rules with max_error decide by; nil without one.
	Risk *RiskSummary `json:"risk,omitempty"`
}

// RiskSummary is what capabilities show of a stored risk threshold: enough to tell which
// threshold a max_error rule applies and what it was fitted for.
type RiskSummary struct {
	TargetError float64   `json:"target_error"`
	Delta       float64   `json:"delta"`
	ThresholdOn string    `json:"threshold_on"`
	Calibrated  bool      `json:"calibrated"`
	AbstainAll  bool      `json:"abstain_all"`
	Threshold   float64   `json:"threshold"`
	Coverage    float64   `json:"coverage"`
	Bound       float64   `json:"bound"`
	N           int       `json:"n"`
	FittedAt    time.Time `json:"fitted_at"`
}

// Limits are the contract's bounds and the deployment's.
type Limits struct {
	MaxQuestions         int   `json:"max_questions"`
	MinOptions           int   `json:"min_options"`
	MaxOptions           int   `json:"max_options"`
	MaxLevels            int   `json:"max_levels"`
	MaxImages            int   `json:"max_images"`
	MaxTextBytes         int   `json:"max_text_bytes"`
	MaxImageRequestBytes int   `json:"max_image_request_bytes"`
	MaxMessageBytes      int32 `json:"max_message_bytes"`
	MaxStoredBytes       int   `json:"max_stored_bytes"`
}

// ProductVersion is the one spelling of a product version sys1 shows everywhere (micro info,
// health, capabilities, records, sys1 status, sys1 version): SemVer, as the NATS micro service
// needs it. A leading "v" (a Git tag, v1.2.3) is dropped; anything else that is not SemVer
// becomes a 0.0.0 pre-release of it (dev → 0.0.0-dev), and an empty one 0.0.0-dev.
func ProductVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	if semver.MatchString(v) {
		return v
	}
	if v2 := "0.0.0-" + sanitiseSemverPart(v); semver.MatchString(v2) {
		return v2
	}
	return "0.0.0-dev"
}

var (
	semver       = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
	notSemverRun = regexp.MustCompile(`[^0-9A-Za-z-]+`)
)

func sanitiseSemverPart(v string) string {
	v = notSemverRun.ReplaceAllString(v, "-")
	if v == "" {
		return "dev"
	}
	return v
}

// startService registers the replica's micro service; stop it with the returned function.
func (w *Worker) startService() (stop func(), err error) {
	svc, err := micro.AddService(w.opt.NC, micro.Config{
		Name:               wire.ServiceName,
		Version:            ProductVersion(w.opt.Version),
		Description:        "sys1 worker replica: System One decisions from JetStream",
		Metadata:           map[string]string{"replica": w.cfg.ID},
		QueueGroupDisabled: true,
	})
	if err != nil {
		return nil, fmt.Errorf("register the micro service %s: %w", wire.ServiceName, err)
	}
	respond := func(name string, build func() any) micro.HandlerFunc {
		return func(req micro.Request) {
			b, err := json.Marshal(build())
			if err != nil {
				_ = req.Error("500", "could not encode the "+name, nil)
				return
			}
			_ = req.Respond(b)
		}
	}
	if err := svc.AddEndpoint("health", respond("health", func() any { return w.Health() }), micro.WithEndpointSubject(wire.HealthSubject)); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro endpoint %s: %w", wire.HealthSubject, err)
	}
	if err := svc.AddEndpoint("capabilities", respond("capabilities", func() any { return w.Capabilities() }), micro.WithEndpointSubject(wire.CapabilitiesSubject)); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro endpoint %s: %w", wire.CapabilitiesSubject, err)
	}
	return func() { _ = svc.Stop() }, nil
}

// fleet is the shared consumers' state, refreshed by watchFleet.
type fleet struct {
	consumers atomic.Pointer[[]ConsumerState]
}

// watchFleet reads the shared consumers' state every interval until ctx ends, so health and
// /metrics answer without a JetStream round trip and a pause shows on every replica within
// one interval.
func (w *Worker) watchFleet(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for tick := 0; ; tick++ {
		w.refreshFleet(ctx, tick)
		if tick%storageEvery == storageEvery-1 { // Run read them just before the first tick
			w.refreshStorage(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *Worker) refreshFleet(ctx context.Context, tick int) {
	w.readPauses(ctx)
	if w.fair != nil && tick%storageEvery != 0 {
		return // listing every flow's consumer is heavier than reading two: less often
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := QueueState(cctx, w.opt.JS, w.opt.Topology)
	if err != nil && ctx.Err() != nil {
		return
	}
	w.fleet.consumers.Store(&out)
}

// QueueState is the request stream's consumers as JetStream sees them now: each lane's shared
// consumer (sys1-worker, sys1-worker-batch) when the fleet reads in arrival order, and with
// fair share one entry per lane summing its flow consumers (named sys1-worker~*, with the
// callers that have messages waiting or in hand). The interactive lane is always listed; an
// error is said in every entry. Pauses are not filled in (see worker/pause).
func QueueState(ctx context.Context, js jetstream.JetStream, t topology.Config) ([]ConsumerState, error) {
	lanes := []topology.Lane{topology.LaneInteractive, topology.LaneBatch}
	shared := map[string]*ConsumerState{}
	sums := make([]ConsumerState, len(lanes))
	for i, l := range lanes {
		sums[i] = ConsumerState{Name: t.FlowConsumerPattern(l), Lane: string(l)}
	}
	seenFlows := make([]bool, len(lanes))
	stream, err := js.Stream(ctx, t.RequestsStream)
	if err == nil {
		infos := stream.ListConsumers(ctx)
		for info := range infos.Info() {
			if info.Name == t.WorkerConsumer || info.Name == t.BatchConsumer {
				shared[info.Name] = &ConsumerState{Name: info.Name, Pending: info.NumPending, AckPending: info.NumAckPending, Redelivery: info.NumRedelivered}
				continue
			}
			for i, l := range lanes {
				if !t.IsFlowConsumer(l, info.Name) {
					continue
				}
				seenFlows[i] = true
				sums[i].Pending += info.NumPending
				sums[i].AckPending += info.NumAckPending
				sums[i].Redelivery += info.NumRedelivered
				if info.NumPending > 0 || info.NumAckPending > 0 {
					sums[i].Callers++
				}
			}
		}
		err = infos.Err()
	}
	var out []ConsumerState
	for i, l := range lanes {
		name := t.WorkerConsumer
		if l == topology.LaneBatch {
			name = t.BatchConsumer
		}
		if c := shared[name]; c != nil {
			out = append(out, *c)
		}
		if seenFlows[i] || (t.FairShare && shared[name] == nil && (l == topology.LaneInteractive || err != nil)) {
			out = append(out, sums[i])
		} else if !t.FairShare && shared[name] == nil && l == topology.LaneInteractive {
			out = append(out, ConsumerState{Name: name})
		}
	}
	if err != nil {
		for i := range out {
			out[i].Error = err.Error()
		}
		return out, fmt.Errorf("the consumers of %s: %w", t.RequestsStream, err)
	}
	return out, nil
}

// queueReadings are the lanes' queues for /metrics, from the fleet watcher's last reading.
func (w *Worker) queueReadings() []metrics.QueueState {
	cs := w.fleet.consumers.Load()
	if cs == nil {
		return nil
	}
	byLane := map[string]int{} // index in out
	var out []metrics.QueueState
	for _, c := range *cs {
		if c.Error != "" {
			continue
		}
		lane := c.Lane
		switch {
		case lane != "":
		case c.Name == w.opt.Topology.WorkerConsumer:
			lane = string(topology.LaneInteractive)
		case c.Name == w.opt.Topology.BatchConsumer:
			lane = string(topology.LaneBatch)
		default:
			continue
		}
		i, ok := byLane[lane]
		if !ok {
			i = len(out)
			byLane[lane] = i
			out = append(out, metrics.QueueState{Lane: lane})
		}
		q := &out[i]
		q.Pending += float64(c.Pending)
		q.AckPending += float64(c.AckPending)
		q.Callers += float64(c.Callers)
	}
	return out
}

// pauseState is a lane's pause as health shows it, nil when the lane is not paused.
func (w *Worker) pauseState(l topology.Lane) *PauseState {
	s, ok := w.pauses.Paused(l)
	if !ok {
		return nil
	}
	p := &PauseState{Reason: s.Reason, Since: s.At.UTC().Format(time.RFC3339)}
	if !s.Open() {
		until := s.Until.UTC()
		p.Until = &until
	}
	return p
}

// UntilResumed is how far ahead a pause without an end is set: far enough that it only ends
// by sys1 resume.
const UntilResumed = pause.UntilResumed

// Health is the replica's health now.
func (w *Worker) Health() Health {
	ch := w.chain.Health()
	h := Health{
		Status: ch.Status, Replica: w.cfg.ID, Version: w.opt.Version, SchemaVersion: contract.RecordSchemaVersion,
		Providers: ch.Providers, CheckedAt: time.Now().UTC(),
		InFlight:  InFlight{Messages: w.stats.inFlight.Load(), ProviderCalls: w.stats.providerNow.Load()},
		Totals:    Totals{Runs: w.stats.succeeded.Load() + w.stats.failed.Load(), ProviderCalls: w.stats.providerCalls.Load()},
		Consumers: []ConsumerState{},
	}
	h.Storage, h.Full = w.Streams(), w.FullStreams()
	if len(h.Full) > 0 && h.Status == HealthOK {
		h.Status = HealthDegraded // answering what it can; Full says what it cannot store
	}
	if h.Storage == nil {
		h.Storage = []StreamUsage{}
	}
	if cs := w.fleet.consumers.Load(); cs != nil {
		h.Consumers = slices.Clone(*cs)
	}
	lanes := map[string]topology.Lane{w.opt.Topology.WorkerConsumer: topology.LaneInteractive, w.opt.Topology.BatchConsumer: topology.LaneBatch}
	for i, c := range h.Consumers {
		l, ok := lanes[c.Name]
		if c.Lane != "" {
			l, ok = topology.Lane(c.Lane), true
		}
		if ok {
			h.Consumers[i].Paused = w.pauseState(l)
		}
	}
	if p := w.pauseState(topology.LaneInteractive); p != nil {
		h.Status, h.Paused = HealthPaused, p
	}
	return h
}

// Capabilities is what the replica accepts and how it is set up.
func (w *Worker) Capabilities() Capabilities {
	c := Capabilities{
		Replica: w.cfg.ID, Version: w.opt.Version,
		SchemaVersions: map[string]int{"record": contract.RecordSchemaVersion},
		Chain:          w.chain.Describe(),
		DefaultModel:   w.opt.ModelPolicy.DefaultModel,
		AllowedModels:  append([]string{}, w.opt.ModelPolicy.AllowedModels...),
		Limits: Limits{
			MaxQuestions: contract.MaxQuestions, MinOptions: contract.MinOptions, MaxOptions: contract.MaxOptions,
			MaxLevels: contract.MaxLevels, MaxImages: contract.MaxImages, MaxTextBytes: contract.MaxTextBytes,
			MaxImageRequestBytes: contract.MaxImageRequestBytes, MaxMessageBytes: w.opt.Topology.MaxMsgSize,
			MaxStoredBytes: w.pipe.storeLimit(),
		},
		Concurrency: w.cfg.Concurrency, ProviderLatencyMS: w.stats.latency.value(), MaxDeliver: w.cfg.MaxDeliver, ConsumerMax: w.opt.Topology.ConsumerMaxDeliver,
		AuthMode:     w.opt.Auth.Mode(),
		Schemas:      map[string]json.RawMessage{},
		Calibration:  []FitSummary{},
		CallerLimits: []CallerLimit{},
	}
	if l := w.pipe.limitsNow(); l != nil {
		for _, r := range l.Rules {
			c.CallerLimits = append(c.CallerLimits, CallerLimit{Name: r.Name, Caller: r.Caller, DecisionsPerMinute: r.DecisionsPerMinute,
				InputTokensPerDay: r.InputTokensPerDay, USDPerDay: r.USDPerDay, InFlight: r.InFlight,
				CacheSeconds: int64(r.Cache / time.Second), CacheOff: r.CacheOff})
		}
	}
	if fits := w.fits.Load(); fits != nil {
		for _, f := range fits.List() {
			s := FitSummary{Model: f.Model, Caller: f.Caller, Question: f.Question, Temperature: f.Temperature, N: f.N, FittedAt: f.FittedAt}
			if r := f.Risk; r != nil {
				s.Risk = &RiskSummary{TargetError: r.TargetError, Delta: r.Delta, ThresholdOn: string(r.ThresholdOn), Calibrated: r.Calibrated,
					AbstainAll: r.AbstainAll, Threshold: r.Threshold, Coverage: r.Coverage, Bound: r.Bound, N: r.N, FittedAt: r.At}
			}
			c.Calibration = append(c.Calibration, s)
		}
	}
	for _, name := range []string{"request", "reply", "record"} {
		if b, err := contract.Schema(name); err == nil {
			c.Schemas[name] = b
		}
	}
	return c
}
