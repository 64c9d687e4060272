package rungate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/rungate/rungatetest"
)

func claimant(runID, caller string, seq uint64, lease string) rungate.Claimant {
	return rungate.Claimant{RunID: runID, Caller: caller, Owns: func(owner string) bool { return owner == caller },
		StreamSeq: seq, Start: time.Now(), Lease: lease, LeaseFor: time.Minute}
}

// TestClaimTellsEveryCaseApart walks one run id through the gate's cases: the first claim
// takes it; the same message while its lease lives is busy, after its owner released it a
// redelivery; another message of the same caller a duplicate; another caller's a conflict;
// once finished, every claim finds the stored outcome.
func TestClaimTellsEveryCaseApart(t *testing.T) {
	ctx := context.Background()
	b := rungatetest.New()
	g := b.Gate()
	step := func(c rungate.Claimant, want rungate.Claim) (*rungate.State, uint64) {
		t.Helper()
		got, st, rev, err := g.Claim(ctx, c)
		if err != nil || got != want {
			t.Fatalf("claim by %s (seq %d, lease %s) = %v, %v; want %v", c.Caller, c.StreamSeq, c.Lease, got, err, want)
		}
		return st, rev
	}
	st, rev := step(claimant("r1", "acme", 10, "d1"), rungate.ClaimNew)
	step(claimant("r1", "acme", 10, "d2"), rungate.ClaimBusy)
	step(claimant("r1", "acme", 11, "d3"), rungate.ClaimDuplicate)
	step(claimant("r1", "mallory", 12, "d4"), rungate.ClaimConflict)

	st.Owner, st.LeaseUntil = "", time.Time{} // the delivery was handed back
	if _, err := g.Save(ctx, "r1", st, rev); err != nil {
		t.Fatal(err)
	}
	st, rev = step(claimant("r1", "acme", 10, "d5"), rungate.ClaimRedelivery)

	st.Status = rungate.StatusDone
	if _, err := g.Save(ctx, "r1", st, rev); err != nil {
		t.Fatal(err)
	}
	step(claimant("r1", "acme", 10, "d6"), rungate.ClaimFinished)
	step(claimant("r1", "acme", 13, "d7"), rungate.ClaimFinished)
	step(claimant("r1", "mallory", 14, "d8"), rungate.ClaimConflict)
}

// TestSaveIsCompareAndSet: a write over a stale revision is a conflict — unless the entry
// already holds exactly what it meant to write (an earlier try landed, its answer lost).
func TestSaveIsCompareAndSet(t *testing.T) {
	ctx := context.Background()
	b := rungatetest.New()
	g := b.Gate()
	_, st, rev, err := g.Claim(ctx, claimant("r2", "acme", 1, "d1"))
	if err != nil {
		t.Fatal(err)
	}
	st.Attempts = nil
	newRev, err := g.Save(ctx, "r2", st, rev)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := g.Save(ctx, "r2", st, rev); err != nil || again != newRev {
		t.Fatalf("saving the same state again over the old revision = %d, %v; want %d (it landed)", again, err, newRev)
	}
	other := *st
	other.Owner = "d9"
	if _, err := g.Save(ctx, "r2", &other, rev); !rungate.IsConflict(err) {
		t.Fatalf("a different state over a stale revision: %v, want a conflict", err)
	}
}

// TestClaimWhoseAnswerWasLost: a create that landed but reported a timeout is this
// delivery's claim, not an error nor somebody else's run.
func TestClaimWhoseAnswerWasLost(t *testing.T) {
	b := rungatetest.New()
	b.LoseNextCreate()
	g := b.Gate()
	got, _, _, err := g.Claim(context.Background(), claimant("r3", "acme", 1, "d1"))
	if err != nil || got != rungate.ClaimNew {
		t.Fatalf("claim = %v, %v; want new", got, err)
	}
}

// TestLookupAndManifests: Lookup finds a run or says none; an entry that is not a run state
// is ErrUnreadable; a batch's manifest is kept for its caller and refused for another.
func TestLookupAndManifests(t *testing.T) {
	ctx := context.Background()
	b := rungatetest.New()
	g := b.Gate()
	if st, _, err := g.Lookup(ctx, "nobody"); st != nil || err != nil {
		t.Fatalf("lookup of an unknown run = %v, %v", st, err)
	}
	if _, err := b.Create(ctx, rungate.Key("junk"), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Lookup(ctx, "junk"); !errors.Is(err, rungate.ErrUnreadable) {
		t.Fatalf("lookup of a junk entry: %v", err)
	}
	m := rungate.Manifest{BatchID: "b1", Caller: "acme", Items: 3}
	if kept, err := g.KeepManifest(ctx, m); !kept || err != nil {
		t.Fatalf("first manifest: %v, %v", kept, err)
	}
	m.Items = 4
	if kept, err := g.KeepManifest(ctx, m); !kept || err != nil {
		t.Fatalf("the owner's update: %v, %v", kept, err)
	}
	m.Caller = "mallory"
	if kept, err := g.KeepManifest(ctx, m); kept || err != nil {
		t.Fatalf("another caller's manifest for the batch: kept %v, %v", kept, err)
	}
}
