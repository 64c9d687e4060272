package main

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// TestPauseWithoutPermissionSaysSo: a NATS user that may not switch the fleet (a producer's)
// is told that it lacks the permission — not that the server might be too old.
func TestPauseWithoutPermissionSaysSo(t *testing.T) {
	srv := natstest.Start(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "admin", Password: "admin-pw"}, {Username: "svc-a", Password: "svc-a-pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"sys1.decide.svc-a"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.svc-a.>"}},
		}}}
	})
	_, js := natstest.Connect(t, srv, nats.UserInfo("admin", "admin-pw"))
	ctx := context.Background()
	if _, err := topology.Ensure(ctx, js, topology.Default()); err != nil {
		t.Fatal(err)
	}
	if _, err := topology.EnsureKeyValue(ctx, js, topology.Default().FleetBucketConfig()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_NATS_USER", "svc-a")
	t.Setenv("SYS1_NATS_PASSWORD", "svc-a-pw")
	t.Setenv("SYS1_NATS_INBOX_PREFIX", "_INBOX.svc-a")
	for _, cmd := range []string{"pause"} { // resume reports through the same helper
		code, _, stderr := runCmd(t, cmd)
		if code != exitFailed || !strings.Contains(stderr, "permission denied") || !strings.Contains(stderr, "operator's NATS user") || strings.Contains(stderr, "2.11") {
			t.Errorf("sys1 %s as a producer: exit %d\n%s", cmd, code, stderr)
		}
	}
}
