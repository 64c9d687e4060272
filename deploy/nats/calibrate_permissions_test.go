package natsdeploy

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/calibration/calibrationtest"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

// The user sys1-calibrate of nats-server.conf (the CronJob's, deploy/kubernetes/calibrate.yaml)
// does what sys1 calibrate does, through the same calls: creates the calibration bucket,
// stores a fit, lists the fits (a watch), writes an evaluation on the revision it read, and
// deletes a fit; the worker's store follows its writes. It can do nothing else: not publish
// requests, not read run records.
func TestPermissionsForCalibrate(t *testing.T) {
	s := startFromFile(t)
	cfg := topology.Default()

	ccfg := natsconn.DefaultConfig()
	ccfg.URL, ccfg.User, ccfg.Password, ccfg.InboxPrefix = s.ClientURL(), "sys1-calibrate", natsconn.Secret(passwords["sys1-calibrate"]), "_INBOX.sys1-calibrate"
	conn, err := natsconn.Connect(context.Background(), ccfg, "sys1 calibrate", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx := ctxT(t, 30*time.Second)
	if _, err := conn.JS.KeyValue(ctx, cfg.CalibrationBucket); err != jetstream.ErrBucketNotFound {
		t.Fatalf("looking the bucket up before it exists: %v, want ErrBucketNotFound", err)
	}
	kv, err := conn.JS.CreateKeyValue(ctx, cfg.CalibrationBucketConfig())
	if err != nil {
		t.Fatalf("create the bucket: %v", err)
	}

	// A worker watches it (its own permissions).
	wcfg := natsconn.DefaultConfig()
	wcfg.URL, wcfg.User, wcfg.Password, wcfg.InboxPrefix = s.ClientURL(), "sys1-worker", natsconn.Secret(passwords["sys1-worker"]), "_INBOX.sys1-worker"
	wconn, err := natsconn.Connect(context.Background(), wcfg, "sys1-worker", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wconn.Close)
	wkv, err := wconn.JS.CreateOrUpdateKeyValue(ctx, cfg.CalibrationBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	store, err := calibration.NewStore(ctx, wkv, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Stop() })

	fit := calibrationtest.Fit("nimble", "billing", "label", contract.TypeChoice, 1.3)
	rev, err := calibration.Put(ctx, kv, fit)
	if err != nil {
		t.Fatalf("put a fit: %v", err)
	}
	entries, err := calibration.List(ctx, kv)
	if err != nil || len(entries) != 1 || entries[0].Fit == nil {
		t.Fatalf("list: %v %+v", err, entries)
	}
	fit.Evaluation = &calibration.Evaluation{At: time.Now().UTC(), Audits: 12}
	b, _ := calibration.Encode(fit)
	rev2, err := kv.Update(ctx, fit.Key(), b, rev)
	if err != nil {
		t.Fatalf("update on a revision (the evaluation): %v", err)
	}
	if err := store.WaitRevision(ctx, rev2); err != nil {
		t.Fatal(err)
	}
	if f, ok := store.Lookup("nimble", "billing", "label"); !ok || f.Evaluation == nil || f.Evaluation.Audits != 12 {
		t.Errorf("the worker's store holds %+v", f)
	}
	if err := calibration.Delete(ctx, kv, fit.Key()); err != nil {
		t.Fatalf("delete: %v", err)
	}

	// Nothing else.
	u := connect(t, s, "sys1-calibrate")
	if err := u.nc.Publish("sys1.decide.svc-a", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	u.expectViolation(t, "Publish", "sys1.decide.svc-a")
	if _, err := u.js.Stream(ctxT(t, negativeWait), "SYS1_RUNS"); err == nil {
		t.Error("sys1-calibrate read SYS1_RUNS")
	}
	u.expectViolation(t, "Publish", "$JS.API.STREAM.INFO.SYS1_RUNS")
}
