package natsdeploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// The Kubernetes manifests connect as users of nats-server.conf, with the inbox prefix its
// subscribe permissions require, and KEDA reads the account those users live in. (Proven to
// work end to end for these users and prefixes by TestPermissionsFromDeployConfig.)
func TestKubernetesManifestsMatchTheServerConfig(t *testing.T) {
	for name, pw := range map[string]string{
		"SYS1_NATS_WORKER_PASSWORD": passwords["sys1-worker"], "SYS1_NATS_SINK_PASSWORD": passwords["sys1-sink"],
		"SYS1_NATS_SVC_A_PASSWORD": passwords["svc-a"], "SYS1_NATS_SVC_B_PASSWORD": passwords["svc-b"],
		"SYS1_NATS_REVIEW_PASSWORD": passwords["sys1-review"], "SYS1_NATS_CALIBRATE_PASSWORD": passwords["sys1-calibrate"],
	} {
		t.Setenv(name, pw)
	}
	opts, err := server.ProcessConfigFile("nats-server.conf")
	if err != nil {
		t.Fatal(err)
	}
	accountOf := map[string]string{}
	for _, u := range opts.Users {
		accountOf[u.Username] = u.Account.Name
	}

	manifest := read(t, "../kubernetes/sys1.yaml")
	envValue := func(doc, name string) string {
		m := regexp.MustCompile(`- name: ` + name + `\n\s+value: (\S+)`).FindStringSubmatch(doc)
		if m == nil {
			return ""
		}
		return m[1]
	}
	deployments := regexp.MustCompile(`(?s)kind: Deployment\n.*?(?:\n---|\z)`).FindAllString(manifest, -1)
	if len(deployments) != 2 {
		t.Fatalf("found %d Deployments in sys1.yaml, want 2 (worker, sink)", len(deployments))
	}
	accounts := map[string]bool{}
	for _, d := range deployments {
		user, prefix := envValue(d, "SYS1_NATS_USER"), envValue(d, "SYS1_NATS_INBOX_PREFIX")
		account, ok := accountOf[user]
		if !ok {
			t.Errorf("a Deployment connects as NATS user %q, which nats-server.conf does not define", user)
			continue
		}
		if prefix != "_INBOX."+user {
			t.Errorf("user %s: SYS1_NATS_INBOX_PREFIX %q, want _INBOX.%s (the only inbox it may read)", user, prefix, user)
		}
		if !regexp.MustCompile(`- name: SYS1_NATS_PASSWORD\n\s+valueFrom: \{secretKeyRef:`).MatchString(d) {
			t.Errorf("user %s: SYS1_NATS_PASSWORD must come from the Secret", user)
		}
		accounts[account] = true
	}

	// The scheduled evaluation (calibrate.yaml): a CronJob running sys1 calibrate --report
	// --apply as sys1-calibrate, in the workers' account, with its password and ClickHouse's
	// DSN from the Secret.
	cron := read(t, "../kubernetes/calibrate.yaml")
	if !strings.Contains(cron, "kind: CronJob") || !strings.Contains(cron, `args: ["calibrate", "--report", "--apply", "--since", "30d"]`) {
		t.Errorf("calibrate.yaml is not a CronJob running sys1 calibrate --report --apply")
	}
	user, prefix := envValue(cron, "SYS1_NATS_USER"), envValue(cron, "SYS1_NATS_INBOX_PREFIX")
	if user != "sys1-calibrate" || prefix != "_INBOX."+user || !accounts[accountOf[user]] {
		t.Errorf("the CronJob connects as %q (account %q) with inbox prefix %q; want sys1-calibrate in the workers' account, _INBOX.sys1-calibrate", user, accountOf[user], prefix)
	}
	for _, want := range []string{`- name: SYS1_NATS_PASSWORD\n\s+valueFrom: \{secretKeyRef:`, `- name: SYS1_CLICKHOUSE_DSN\n\s+valueFrom: \{secretKeyRef:`} {
		if !regexp.MustCompile(want).MatchString(cron) {
			t.Errorf("the CronJob's %s must come from the Secret", want)
		}
	}

	// KEDA scales on the workers' own queue-depth metric (its query is evaluated by
	// Prometheus's engine in deploy/prometheus): with fair share no one consumer's pending
	// count is the queue, so the nats-jetstream scaler must not come back.
	if keda := read(t, "../kubernetes/autoscaling.yaml"); !strings.Contains(keda, "type: prometheus") || !strings.Contains(keda, "sys1_worker_queue_pending") || strings.Contains(keda, "type: nats-jetstream") {
		t.Errorf("autoscaling.yaml does not scale on sys1_worker_queue_pending with KEDA's prometheus scaler")
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
