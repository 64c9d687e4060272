package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// Cancelling a batch.
//
// 'sys1 batch cancel ID' writes a cancel marker (CancelMarkerKey) into the run-id gate's
// bucket, then purges the batch's queued messages from the request stream (twice: see Cancel).
// A batch run that is going on reads the marker every second, and a later run of the same batch
// reads it before sending anything. From then on every unanswered item is published with
// Sys1-Deadline set to the cancel time. The worker settles the run-id gate before it checks
// the deadline, so an item that had finished is answered from its stored outcome and keeps its
// result. Any other item is answered SYS1_EXPIRED without a provider call, and that expiry
// (the deadline in its message is exactly the cancel time) is reported as status "cancelled".
// The worker stores the expiry as the item's outcome, so every later run reports the same
// lines. The marker lives as long as the gate's entries do (the bucket's TTL,
// SYS1_RUN_ID_TTL); a cancelled batch stays cancelled, and running its input again under a
// new --id runs it afresh.

// CancelMarkerKey is the cancel marker's key in the run-id gate bucket. Gate entries' keys
// start with "r" (rungate.Key), so the two never meet.
func CancelMarkerKey(batchID string) string { return "batch-cancelled." + batchID }

// CancelMarker is the marker's value.
type CancelMarker struct {
	BatchID     string    `json:"batch_id"`
	CancelledAt time.Time `json:"cancelled_at"`
}

// ReadCancelMarker reads a batch's cancel marker with one JetStream direct get, which needs no
// more than permission to publish to $JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>.
// A missing bucket (no worker ever ran) means no marker.
func ReadCancelMarker(ctx context.Context, nc *nats.Conn, bucket, batchID string) (time.Time, bool, error) {
	subj := "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + CancelMarkerKey(batchID)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Subscribe, publish and flush by hand rather than nc.Request: a publish the server's
	// permissions refuse is answered by an -ERR that arrives before the flush's PONG, so a
	// producer without the permission learns it at once instead of after the timeout.
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the cancel marker: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subj, inbox, nil); err != nil {
		return time.Time{}, false, fmt.Errorf("read the cancel marker: %w", err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return time.Time{}, false, fmt.Errorf("read the cancel marker: %w", err)
	}
	if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && (strings.Contains(last.Error(), subj) || strings.Contains(last.Error(), inbox)) {
		return time.Time{}, false, fmt.Errorf("NATS permissions refuse reading it (%v)", last)
	}
	msg, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the cancel marker: %w", err)
	}
	if msg.Header.Get("Status") == "503" && len(msg.Data) == 0 {
		return time.Time{}, false, nil // no responders: no bucket, so no marker
	}
	if len(msg.Data) == 0 {
		if st := msg.Header.Get("Status"); st == "404" {
			return time.Time{}, false, nil
		} else if st != "" {
			return time.Time{}, false, fmt.Errorf("read the cancel marker: status %s %s", st, msg.Header.Get("Description"))
		}
	}
	if op := msg.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return time.Time{}, false, nil
	}
	var m CancelMarker
	if err := json.Unmarshal(msg.Data, &m); err != nil || m.CancelledAt.IsZero() {
		return time.Time{}, false, fmt.Errorf("the cancel marker of batch %s is not readable", batchID)
	}
	return m.CancelledAt, true, nil
}

// Names are the JetStream objects Status and Cancel use.
type Names struct {
	RequestsStream string // default SYS1_REQUESTS
	RunsBucket     string // default sys1-runs
}

func (n Names) withDefaults() Names {
	if n.RequestsStream == "" {
		n.RequestsStream = topology.Default().RequestsStream
	}
	if n.RunsBucket == "" {
		n.RunsBucket = topology.Default().RunsBucket
	}
	return n
}

// StatusReport is what NATS knows about a batch, without its input.
type StatusReport struct {
	BatchID string `json:"batch_id"`
	// Caller narrows the stream count to sys1.batch.<caller>.<batch id>; empty: any caller.
	Caller string `json:"caller,omitempty"`
	// From the run-id gate: items concluded, and items being run.
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	Running   int `json:"running"`
	// ErrorCodes counts the failed items by code.
	ErrorCodes map[string]int `json:"error_codes"`
	// InStream is the batch's messages in the request stream: queued or being run (a running
	// item's message stays until it is acknowledged), and re-sent copies.
	InStream    uint64     `json:"in_stream"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
	// From the batch's manifest (rungate.Manifest), which sys1 batch run publishes before
	// anything else: the input's items, and those that failed the contract check and were
	// never sent. Items is null when no manifest is known (a batch run by an older sys1).
	Items   *int `json:"items"`
	Invalid int  `json:"invalid"`
}

// Known reports whether NATS holds any trace of the batch.
func (s *StatusReport) Known() bool {
	return s.Succeeded+s.Failed+s.Cancelled+s.Running > 0 || s.InStream > 0 || s.CancelledAt != nil || s.Items != nil
}

// storedReply is the part of a finished run's stored reply (rungate.State.Reply) status reads.
type storedReply struct {
	Error *errorBody `json:"error"`
}

// Status counts a batch's items from the run-id gate (one filtered watch over the batch's
// keys, rungate.GroupFilter) and its messages in the request stream. It needs read access
// to the gate bucket and stream info; it works from any machine with those NATS permissions.
func Status(ctx context.Context, js jetstream.JetStream, names Names, batchID, caller string) (*StatusReport, error) {
	if err := ValidBatchID(batchID); err != nil {
		return nil, err
	}
	if caller != "" {
		if err := ValidCaller(caller); err != nil {
			return nil, err
		}
	}
	names = names.withDefaults()
	rep := &StatusReport{BatchID: batchID, Caller: caller, ErrorCodes: map[string]int{}}
	kv, err := js.KeyValue(ctx, names.RunsBucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		// No worker ever ran here: nothing is known, nothing is queued.
	case err != nil:
		return nil, fmt.Errorf("run-id gate bucket %s: %w", names.RunsBucket, err)
	default:
		// The marker first: the items expired at the cancel time are counted as cancelled.
		if e, err := kv.Get(ctx, CancelMarkerKey(batchID)); err == nil {
			var m CancelMarker
			if json.Unmarshal(e.Value(), &m) == nil && !m.CancelledAt.IsZero() {
				rep.CancelledAt = &m.CancelledAt
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("read the cancel marker: %w", err)
		}
		if e, err := kv.Get(ctx, rungate.ManifestKey(batchID)); err == nil {
			var m rungate.Manifest
			if json.Unmarshal(e.Value(), &m) == nil && (caller == "" || m.Caller == caller) {
				rep.Items, rep.Invalid = &m.Items, m.Invalid
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("read the batch's manifest: %w", err)
		}
		if err := rep.readGate(ctx, kv); err != nil {
			return nil, err
		}
	}
	n, err := inStream(ctx, js, names.RequestsStream, streamFilter(caller, batchID))
	if err != nil {
		return nil, err
	}
	rep.InStream = n
	return rep, nil
}

func (s *StatusReport) readGate(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchFiltered(ctx, []string{rungate.GroupFilter(s.BatchID)}, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("watch the run-id gate: %w", err)
	}
	defer func() { _ = w.Stop() }()
	mark := ""
	if s.CancelledAt != nil {
		mark = s.CancelledAt.UTC().Format(time.RFC3339Nano)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the run-id gate watch ended early")
			}
			if e == nil {
				return nil // every current entry was delivered
			}
			var g rungate.State
			if json.Unmarshal(e.Value(), &g) != nil {
				continue
			}
			var reply *storedReply
			if len(g.Reply) > 0 {
				reply = &storedReply{}
				if json.Unmarshal(g.Reply, reply) != nil {
					reply = nil
				}
			}
			switch {
			case g.Status != rungate.StatusDone:
				s.Running++
			case strings.HasSuffix(g.Subject, "."+string(contract.StatusSuccess)):
				s.Succeeded++
			case mark != "" && reply != nil && reply.Error != nil && reply.Error.Code == string(contract.CodeExpired) && strings.Contains(reply.Error.Message, mark):
				s.Cancelled++
			default:
				s.Failed++
				code := "unknown"
				if reply != nil && reply.Error != nil && reply.Error.Code != "" {
					code = reply.Error.Code
				}
				s.ErrorCodes[code]++
			}
		}
	}
}

func streamFilter(caller, batchID string) string {
	if caller == "" {
		caller = "*"
	}
	return wire.Batch(caller, batchID)
}

// inStream counts the stream's messages on filter.
func inStream(ctx context.Context, js jetstream.JetStream, stream, filter string) (uint64, error) {
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("request stream %s: %w", stream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("request stream %s: %w", stream, err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

// CancelReport is what Cancel did.
type CancelReport struct {
	BatchID     string    `json:"batch_id"`
	CancelledAt time.Time `json:"cancelled_at"`
	// AlreadyCancelled: an earlier cancel's marker was found and kept (its time stands).
	AlreadyCancelled bool `json:"already_cancelled"`
	// Purged is how many queued messages of the batch were removed from the stream.
	Purged uint64 `json:"purged"`
	// After is the batch's status once purged: finished items keep their results.
	After *StatusReport `json:"status"`
}

// Cancel stops a batch (see the comment on cancelling above): it writes the cancel marker,
// then purges the batch's queued messages from the request stream. Items being run when it is
// cancelled finish and keep their results. It needs write access to the gate bucket and
// permission to purge the request stream: an operator's command.
//
// A run going on notices the marker within its CancelPoll; what it published before that is
// not cancelled by the first purge, so after settle (longer than the runs' CancelPoll) Cancel
// purges again. Zero settle purges once.
func Cancel(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, names Names, batchID, caller string, now time.Time, settle time.Duration) (*CancelReport, error) {
	if err := ValidBatchID(batchID); err != nil {
		return nil, err
	}
	if caller != "" {
		if err := ValidCaller(caller); err != nil {
			return nil, err
		}
	}
	names = names.withDefaults()
	kv, err := js.KeyValue(ctx, names.RunsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("no run-id gate bucket %s on this NATS: no worker has run here, so there is no batch %s to cancel", names.RunsBucket, batchID)
	}
	if err != nil {
		return nil, fmt.Errorf("run-id gate bucket %s: %w", names.RunsBucket, err)
	}
	rep := &CancelReport{BatchID: batchID, CancelledAt: now.UTC()}
	val, _ := json.Marshal(CancelMarker{BatchID: batchID, CancelledAt: rep.CancelledAt})
	if _, err := kv.Create(ctx, CancelMarkerKey(batchID), val); errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := kv.Get(ctx, CancelMarkerKey(batchID))
		var m CancelMarker
		if gerr != nil || json.Unmarshal(e.Value(), &m) != nil || m.CancelledAt.IsZero() {
			return nil, fmt.Errorf("batch %s has an unreadable cancel marker", batchID)
		}
		rep.CancelledAt, rep.AlreadyCancelled = m.CancelledAt, true
	} else if err != nil {
		return nil, fmt.Errorf("write the cancel marker: %w", err)
	}
	// The marker is written first: a run going on sees it and stops sending work, and what it
	// queued before is purged now.
	n, err := purge(ctx, nc, names.RequestsStream, streamFilter(caller, batchID))
	if err != nil {
		return nil, err
	}
	rep.Purged = n
	if settle > 0 {
		t := time.NewTimer(settle)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		n, err := purge(ctx, nc, names.RequestsStream, streamFilter(caller, batchID))
		if err != nil {
			return nil, err
		}
		rep.Purged += n
	}
	if rep.After, err = Status(ctx, js, names, batchID, caller); err != nil {
		return nil, err
	}
	return rep, nil
}

// purge removes the stream's messages on filter and returns how many; jetstream's Purge does
// not say.
func purge(ctx context.Context, nc *nats.Conn, stream, filter string) (uint64, error) {
	req, _ := json.Marshal(map[string]string{"filter": filter})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+stream, req)
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, errors.New("JetStream is not enabled on this NATS")
	}
	if err != nil {
		return 0, fmt.Errorf("purge %s from %s: %w", filter, stream, err)
	}
	var resp struct {
		Success bool   `json:"success"`
		Purged  uint64 `json:"purged"`
		Error   *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge %s from %s: %w", filter, stream, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrCode == int(jetstream.JSErrCodeStreamNotFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("purge %s from %s: %s", filter, stream, resp.Error.Description)
	}
	return resp.Purged, nil
}

// Print writes the report for a person.
func (s *StatusReport) Print(w interface{ Write([]byte) (int, error) }) {
	fmt.Fprintf(w, "batch %s", s.BatchID)
	if s.Caller != "" {
		fmt.Fprintf(w, " (caller %s)", s.Caller)
	}
	if s.CancelledAt != nil {
		fmt.Fprintf(w, ": cancelled at %s", s.CancelledAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(w)
	if s.Items != nil {
		fmt.Fprintf(w, "  items      %d in the input\n", *s.Items)
	}
	fmt.Fprintf(w, "  finished   %d (succeeded %d, failed %d, cancelled %d)\n", s.Succeeded+s.Failed+s.Cancelled, s.Succeeded, s.Failed, s.Cancelled)
	if s.Items != nil {
		fmt.Fprintf(w, "  invalid    %d (failed the contract check; never sent)\n", s.Invalid)
	}
	if len(s.ErrorCodes) > 0 {
		codes := make([]string, 0, len(s.ErrorCodes))
		for c := range s.ErrorCodes {
			codes = append(codes, c)
		}
		sort.Strings(codes)
		fmt.Fprintf(w, "  failed by code:")
		for _, c := range codes {
			fmt.Fprintf(w, " %s %d", c, s.ErrorCodes[c])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  running    %d\n", s.Running)
	fmt.Fprintf(w, "  in stream  %d (queued or being run)\n", s.InStream)
}
