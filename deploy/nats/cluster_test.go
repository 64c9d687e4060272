package natsdeploy

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func setPasswords(t *testing.T) {
	t.Helper()
	t.Setenv("SYS1_NATS_WORKER_PASSWORD", passwords["sys1-worker"])
	t.Setenv("SYS1_NATS_SINK_PASSWORD", passwords["sys1-sink"])
	t.Setenv("SYS1_NATS_SVC_A_PASSWORD", passwords["svc-a"])
	t.Setenv("SYS1_NATS_SVC_B_PASSWORD", passwords["svc-b"])
	t.Setenv("SYS1_NATS_REVIEW_PASSWORD", passwords["sys1-review"])
	t.Setenv("SYS1_NATS_CALIBRATE_PASSWORD", passwords["sys1-calibrate"])
}

// sameUsers reports how two configurations' users differ (name, account, permissions), or "".
func sameUsers(a, b *server.Options) string {
	index := func(o *server.Options) map[string]*server.User {
		m := map[string]*server.User{}
		for _, u := range o.Users {
			m[u.Username] = u
		}
		return m
	}
	ua, ub := index(a), index(b)
	if len(ua) != len(ub) {
		return fmt.Sprintf("%d users, want %d", len(ub), len(ua))
	}
	for name, u := range ua {
		v, ok := ub[name]
		switch {
		case !ok:
			return "no user " + name
		case u.Account.Name != v.Account.Name:
			return fmt.Sprintf("user %s in account %s, want %s", name, v.Account.Name, u.Account.Name)
		case !reflect.DeepEqual(u.Permissions, v.Permissions):
			return "user " + name + " has other permissions"
		case u.Password != v.Password:
			return "user " + name + " has another password"
		}
	}
	return ""
}

// nats-cluster.conf is nats-server.conf plus a cluster: each of its three nodes loads with the
// same users and permissions, its own server name and routes to all three. Three servers
// started from it (on loopback ports instead of the machines' names) form a JetStream cluster
// in which the worker, as its NATS user, sets up sys1's streams, bucket and consumers at R3,
// and a producer's request is stored on three nodes.
func TestClusterConfigFromDeploy(t *testing.T) {
	setPasswords(t)
	single, err := server.ProcessConfigFile("nats-server.conf")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*server.Options
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("sys1-nats-%d", i)
		t.Setenv("SYS1_NATS_SERVER_NAME", name)
		o, err := server.ProcessConfigFile("nats-cluster.conf")
		if err != nil {
			t.Fatalf("nats-cluster.conf as %s: %v", name, err)
		}
		if o.ServerName != name {
			t.Errorf("server name %q, want %q (from SYS1_NATS_SERVER_NAME)", o.ServerName, name)
		}
		if o.Cluster.Name != "sys1" || o.Cluster.Port != 6222 {
			t.Errorf("cluster %q on port %d, want sys1 on 6222", o.Cluster.Name, o.Cluster.Port)
		}
		var routes []string
		for _, r := range o.Routes {
			routes = append(routes, r.Host)
		}
		if want := []string{"sys1-nats-1:6222", "sys1-nats-2:6222", "sys1-nats-3:6222"}; !reflect.DeepEqual(routes, want) {
			t.Errorf("routes %v, want %v", routes, want)
		}
		if why := sameUsers(single, o); why != "" {
			t.Errorf("nats-cluster.conf's users differ from nats-server.conf's: %s", why)
		}
		if !o.JetStream || o.StoreDir != single.StoreDir || o.MaxPayload != single.MaxPayload || o.HTTPHost != single.HTTPHost {
			t.Errorf("JetStream %v in %q, max_payload %d, monitoring on %q: want nats-server.conf's", o.JetStream, o.StoreDir, o.MaxPayload, o.HTTPHost)
		}
		if !o.SyncAlways || !single.SyncAlways {
			t.Errorf("sync_interval %s (always %v): sys1's nodes write every message to disk before its ack", o.SyncInterval, o.SyncAlways)
		}
		nodes = append(nodes, o)
	}
	if t.Failed() {
		return
	}

	// Run the three nodes on this machine.
	ports := natstest.FreePorts(t, 2*len(nodes))
	var routes []*url.URL
	for i := range nodes {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])})
	}
	var servers []*server.Server
	for i, o := range nodes {
		o.Host, o.Port, o.HTTPPort = "127.0.0.1", ports[2*i], 0
		o.Cluster.Host, o.Cluster.Port, o.Routes = "127.0.0.1", ports[2*i+1], routes
		o.StoreDir, o.NoLog, o.NoSigs = t.TempDir(), true, true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("%s not ready", o.ServerName)
		}
		servers = append(servers, s)
	}
	natstest.WaitUntil(t, 60*time.Second, "the cluster to become healthy", func() (bool, string) {
		for _, s := range servers {
			if st := s.Healthz(nil); st.Status != "ok" {
				return false, s.Name() + ": " + st.Error
			}
		}
		return natstest.PlacementReady(servers)
	})

	cfg := topology.Default()
	cfg.Replicas = 3
	wcfg := natsconn.DefaultConfig()
	wcfg.URL, wcfg.User, wcfg.Password, wcfg.InboxPrefix = servers[0].ClientURL(), "sys1-worker", natsconn.Secret(passwords["sys1-worker"]), "_INBOX.sys1-worker"
	wconn, err := natsconn.Connect(context.Background(), wcfg, "sys1-worker", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wconn.Close)
	if _, err := topology.Ensure(ctxT(t, 30*time.Second), wconn.JS, cfg); err != nil {
		t.Fatalf("worker: topology.Ensure at R3: %v", err)
	}
	if _, err := topology.EnsureWorkerConsumer(ctxT(t, 30*time.Second), wconn.JS, cfg); err != nil {
		t.Fatalf("worker: consumer at R3: %v", err)
	}
	if _, err := topology.EnsureDeadLetterConsumer(ctxT(t, 30*time.Second), wconn.JS, cfg); err != nil {
		t.Fatalf("worker: dead-letter consumer at R3: %v", err)
	}

	svcA := connect(t, servers[2], "svc-a") // another node than the worker's
	if _, err := svcA.js.Publish(ctxT(t, 10*time.Second), "sys1.decide.svc-a", []byte(`{}`)); err != nil {
		t.Fatalf("svc-a: publish a request: %v", err)
	}
	natstest.WaitUntil(t, 30*time.Second, "the request on three nodes", func() (bool, string) {
		s, err := wconn.JS.Stream(ctxT(t, 5*time.Second), cfg.RequestsStream)
		if err != nil {
			return false, err.Error()
		}
		info := s.CachedInfo()
		if info.State.Msgs != 1 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
			return false, fmt.Sprintf("%d messages, cluster %+v", info.State.Msgs, info.Cluster)
		}
		for _, p := range info.Cluster.Replicas {
			if !p.Current {
				return false, p.Name + " not current"
			}
		}
		return true, ""
	})
}

// The Helm values for the official chart run three JetStream nodes with nats-server.conf's
// users: they include it under the name the install command gives it, pass every password it
// reads from a Secret, and serve monitoring where the chart's probes and KEDA look. The check
// renders the chart's way of combining them (the include first, the chart's and the merged keys
// after it) and loads the result.
func TestHelmValuesRunTheServerConfig(t *testing.T) {
	raw := read(t, "../kubernetes/nats-values.yaml")
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool
				Replicas int
			}
			JetStream struct {
				Enabled   bool
				FileStore struct {
					PVC struct{ Size string } `yaml:"pvc"`
				} `yaml:"fileStore"`
				Merge map[string]string
			} `yaml:"jetstream"`
			Merge map[string]string
		}
		Container struct {
			Env map[string]struct {
				ValueFrom struct {
					SecretKeyRef struct{ Name, Key string } `yaml:"secretKeyRef"`
				} `yaml:"valueFrom"`
			}
		}
	}
	if err := yaml.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 || !v.Config.JetStream.Enabled || v.Config.JetStream.FileStore.PVC.Size == "" {
		t.Errorf("cluster %+v, JetStream %+v: want 3 clustered JetStream nodes on volumes", v.Config.Cluster, v.Config.JetStream)
	}
	include := v.Config.Merge["00$include"]
	if include == "" || !strings.Contains(raw, `--set-file 'configMap.merge.data.`+strings.ReplaceAll(include, ".", `\.`)+`=deploy/nats/nats-server.conf'`) {
		t.Errorf("the values include %q; the install command must put nats-server.conf there", include)
	}
	conf := read(t, "nats-server.conf")
	for _, m := range regexp.MustCompile(`\$(SYS1_NATS_[A-Z_]+_PASSWORD)`).FindAllStringSubmatch(conf, -1) {
		if e, ok := v.Container.Env[m[1]]; !ok || e.ValueFrom.SecretKeyRef.Key == "" {
			t.Errorf("nats-server.conf reads %s; the values do not set it from a Secret", m[1])
		}
	}

	// The chart's nats.conf: the include, then the chart's keys for one pod, then the merged ones.
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/"+include, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// The chart's jetstream block replaces the included one: config.jetstream.merge goes into it.
	var jsMerged string
	for k, val := range v.Config.JetStream.Merge {
		jsMerged += ", " + k + ": " + val
	}
	var merged []string
	for k, val := range v.Config.Merge {
		if !strings.HasSuffix(k, "$include") {
			merged = append(merged, k+": "+strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(val, "<<"), ">>")))
		}
	}
	rendered := fmt.Sprintf(`include %s
server_name: nats-0
lame_duck_grace_period: 10s
lame_duck_duration: 30s
port: 4222
http_port: 8222
cluster { name: nats, port: 6222, no_advertise: true, routes: [nats://nats-0.nats-headless:6222, nats://nats-1.nats-headless:6222, nats://nats-2.nats-headless:6222] }
jetstream { max_memory_store: 0, store_dir: /data, max_file_store: %s%s }
%s
`, include, v.Config.JetStream.FileStore.PVC.Size, jsMerged, strings.Join(merged, "\n"))
	if err := os.WriteFile(dir+"/nats.conf", []byte(rendered), 0o644); err != nil {
		t.Fatal(err)
	}
	setPasswords(t)
	o, err := server.ProcessConfigFile(dir + "/nats.conf")
	if err != nil {
		t.Fatalf("the chart's configuration with these values does not load: %v\n%s", err, rendered)
	}
	single, err := server.ProcessConfigFile("nats-server.conf")
	if err != nil {
		t.Fatal(err)
	}
	if why := sameUsers(single, o); why != "" {
		t.Errorf("users differ from nats-server.conf's: %s", why)
	}
	if !o.SyncAlways {
		t.Errorf("the chart's nodes leave JetStream's sync_interval at %s; sys1 ships always (config.jetstream.merge)", o.SyncInterval)
	}
	if o.HTTPHost != "0.0.0.0" || o.HTTPPort != 8222 {
		t.Errorf("monitoring on %s:%d; the chart's probes and KEDA need it on the pod's address, port 8222", o.HTTPHost, o.HTTPPort)
	}
	if o.ServerName != "nats-0" || o.StoreDir != "/data" || o.MaxPayload != single.MaxPayload {
		t.Errorf("server %q, store %q, max_payload %d: want the chart's name and store and nats-server.conf's max_payload", o.ServerName, o.StoreDir, o.MaxPayload)
	}
}
