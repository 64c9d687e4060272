package natsconn

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// waitFor polls cond until it holds or 5 s pass (natstest.WaitFor).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, 5*time.Second, what, cond)
}

// startServer runs a nats-server with JetStream shaped by opts (users, TLS, …).
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	return natstest.Start(t, func(o *server.Options) {
		storeDir := o.StoreDir
		*o = *opts
		o.Host, o.Port, o.NoSigs, o.NoLog, o.JetStream = "127.0.0.1", -1, true, true, true
		if o.StoreDir == "" {
			o.StoreDir = storeDir
		}
	})
}

// roundTrip proves the connection and its JetStream context work end to end.
func roundTrip(t *testing.T, c *Conn, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	ack, err := c.JS.Publish(ctx, stream+".x", []byte("hello"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ack.Stream != stream || ack.Sequence != 1 {
		t.Fatalf("ack %+v", ack)
	}
}

func remoteConfig(s *server.Server) Config {
	c := DefaultConfig()
	c.URL = s.ClientURL()
	return c
}

func assertNoSecret(t *testing.T, secret string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		if strings.Contains(s, secret) {
			t.Fatalf("secret leaked into: %s", s)
		}
	}
}

func TestConnectUserPassword(t *testing.T) {
	const password = "pa55-w0rd-that-must-not-leak"
	s := startServer(t, &server.Options{Users: []*server.User{{Username: "sys1-worker", Password: password}}})

	var logs natstest.Buffer
	cfg := remoteConfig(s)
	cfg.User, cfg.Password = "sys1-worker", password
	c, err := Connect(context.Background(), cfg, "test-worker", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "UP")
	c.Close()
	c.Close() // idempotent
	if !c.NC.IsClosed() {
		t.Fatal("Close must close the connection")
	}

	cfg.Password = "wrong-" + password
	start := time.Now()
	_, err = Connect(context.Background(), cfg, "test-worker", zerolog.New(&logs))
	if err == nil {
		t.Fatal("wrong password accepted")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("a rejected credential must fail at once, not be retried")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") || !strings.Contains(err.Error(), "SYS1_NATS_") {
		t.Fatalf("unclear error: %v", err)
	}
	assertNoSecret(t, password, err.Error(), fmt.Sprintf("%+v", cfg), logs.String())
	assertNoSecret(t, "wrong-", err.Error(), logs.String())
}

func TestConnectToken(t *testing.T) {
	const token = "t0ken-that-must-not-leak"
	s := startServer(t, &server.Options{Authorization: token})
	var logs natstest.Buffer
	cfg := remoteConfig(s)
	cfg.Token = token
	c, err := Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "TOK")
	c.Close()
	cfg.Token = "bad-" + token
	_, err = Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err == nil {
		t.Fatal("bad token accepted")
	}
	assertNoSecret(t, token, err.Error(), logs.String())
}

func TestConnectNKey(t *testing.T) {
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	s := startServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})

	dir := t.TempDir()
	seedFile := filepath.Join(dir, "worker.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs natstest.Buffer
	cfg := remoteConfig(s)
	cfg.NKeyFile = seedFile
	c, err := Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "NK")
	c.Close()

	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	if err := os.WriteFile(seedFile, otherSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err == nil {
		t.Fatal("unknown nkey accepted")
	}
	assertNoSecret(t, string(seed), err.Error(), logs.String())
	assertNoSecret(t, string(otherSeed), err.Error(), logs.String())

	if err := os.WriteFile(seedFile, []byte("not a seed"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err = Connect(context.Background(), cfg, "t", zerolog.New(&logs)); err == nil || !strings.Contains(err.Error(), "SYS1_NATS_NKEY") {
		t.Fatalf("want an error naming SYS1_NATS_NKEY, got %v", err)
	}
}

// TestConnectCredsFile runs the server in operator (decentralised JWT) mode, the way NGS and
// most production clusters are set up, and connects with a .creds file.
func TestConnectCredsFile(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opPub, _ := okp.PublicKey()
	opc := jwt.NewOperatorClaims(opPub)

	akp, _ := nkeys.CreateAccount()
	aPub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(aPub)
	ac.Limits.JetStreamLimits.DiskStorage = -1
	ac.Limits.JetStreamLimits.MemoryStorage = -1
	aJWT, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	uPub, _ := ukp.PublicKey()
	uJWT, err := jwt.NewUserClaims(uPub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(uJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "worker.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}

	// Operator mode with JetStream needs a system account.
	skp, _ := nkeys.CreateAccount()
	sPub, _ := skp.PublicKey()
	sJWT, err := jwt.NewAccountClaims(sPub).Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	if err := resolver.Store(aPub, aJWT); err != nil {
		t.Fatal(err)
	}
	if err := resolver.Store(sPub, sJWT); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &server.Options{TrustedOperators: []*jwt.OperatorClaims{opc}, AccountResolver: resolver, SystemAccount: sPub})

	var logs natstest.Buffer
	cfg := remoteConfig(s)
	cfg.CredsFile = credsFile
	c, err := Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "CREDS")
	c.Close()
	assertNoSecret(t, string(seed), logs.String())
}

func TestEmbeddedServer(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	var logs natstest.Buffer
	cfg := DefaultConfig()
	cfg.DataDir = dataDir
	cfg.Listen = "127.0.0.1:-1"
	c, err := Connect(context.Background(), cfg, "embedded-test", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if c.Embedded == nil {
		t.Fatal("SYS1_NATS_URL unset must start an embedded server")
	}
	url := c.Embedded.ClientURL()
	if !strings.Contains(logs.String(), "started an embedded NATS server") || !strings.Contains(logs.String(), url) {
		t.Fatalf("start-up log must say so with the URL %s: %s", url, logs.String())
	}
	roundTrip(t, c, "EMB")
	if mp := c.NC.MaxPayload(); mp != 8<<20 {
		t.Fatalf("max payload %d, want 8 MiB", mp)
	}
	// Another client (sys1 decide, the nats CLI) can reach it from outside the process.
	other, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	other.Close()

	// JetStream's file store lives under SYS1_DATA_DIR.
	if _, err := os.Stat(filepath.Join(dataDir, "jetstream")); err != nil {
		t.Fatalf("no JetStream data under SYS1_DATA_DIR: %v", err)
	}
	var found bool
	_ = filepath.Walk(dataDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Name() == "EMB" && info.IsDir() {
			found = true
		}
		return nil
	})
	if !found {
		t.Fatal("stream EMB not stored under SYS1_DATA_DIR")
	}

	c.Close()
	if c.Embedded.Running() {
		t.Fatal("Close must shut the embedded server down")
	}

	// A restart on the same data dir keeps the stream and its message.
	c2, err := Connect(context.Background(), cfg, "embedded-test", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c2.JS.Stream(ctx, "EMB")
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().State.Msgs != 1 {
		t.Fatalf("want the message to survive a restart, state %+v", st.CachedInfo().State)
	}
}

func TestEmbeddedServerWithPassword(t *testing.T) {
	const password = "embedded-secret-value"
	var logs natstest.Buffer
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:-1"
	cfg.User, cfg.Password = "dev", password
	c, err := Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "EMBPW")
	if _, err := nats.Connect(c.Embedded.ClientURL()); err == nil {
		t.Fatal("the embedded server must refuse clients without the configured password")
	}
	assertNoSecret(t, password, logs.String())
}

func TestReconnectIsLogged(t *testing.T) {
	store := t.TempDir()
	s, err := StartEmbedded(EmbeddedOptions{Port: -1, StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	port := s.Addr().(*net.TCPAddr).Port
	var logs natstest.Buffer
	cfg := remoteConfig(s)
	c, err := Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	s.Shutdown()
	s.WaitForShutdown()
	waitFor(t, "disconnect log", func() bool { return strings.Contains(logs.String(), "disconnected from NATS") })

	s2, err := StartEmbedded(EmbeddedOptions{Port: port, StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s2.Shutdown(); s2.WaitForShutdown() }()
	waitFor(t, "reconnect log", func() bool { return strings.Contains(logs.String(), "reconnected to NATS") })
	if !c.NC.IsConnected() {
		t.Fatal("not connected after reconnect")
	}
}

func TestConnectGivesUpWhenContextEnds(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	var logs natstest.Buffer
	cfg := DefaultConfig()
	cfg.URL = "nats://svc:hunter2@127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err = Connect(ctx, cfg, "t", zerolog.New(&logs))
	if err == nil || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("want a give-up error, got %v", err)
	}
	if !strings.Contains(logs.String(), "cannot reach NATS yet") {
		t.Fatalf("retries must be logged: %s", logs.String())
	}
	assertNoSecret(t, "hunter2", err.Error(), logs.String())
}

func TestConfigFromEnvAndValidate(t *testing.T) {
	t.Setenv("SYS1_NATS_URL", "nats://a:4222,tls://b:4222")
	t.Setenv("SYS1_NATS_USER", "sys1-worker")
	t.Setenv("SYS1_NATS_PASSWORD", "env-secret-value")
	var cfg Config
	if err := env.Parse(&cfg); err != nil {
		t.Fatal(err)
	}
	if errs := cfg.Validate(); len(errs) != 0 {
		t.Fatalf("valid config rejected: %v", errs)
	}
	if cfg.DataDir != "./data" || cfg.Listen != "127.0.0.1:4222" || cfg.MaxPayload != 8<<20 {
		t.Fatalf("defaults %+v", cfg)
	}
	j, _ := json.Marshal(cfg)
	assertNoSecret(t, "env-secret-value", fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), string(j))

	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	goodCreds := filepath.Join(dir, "good.creds")
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	akp, _ := nkeys.CreateAccount()
	ujwt, _ := jwt.NewUserClaims(upub).Encode(akp)
	useed, _ := ukp.Seed()
	creds, _ := jwt.FormatUserConfig(ujwt, useed)
	if err := os.WriteFile(goodCreds, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"defaults (embedded)", func(c *Config) {}, nil},
		{"bad scheme", func(c *Config) { c.URL = "http://x:4222" }, []string{"SYS1_NATS_URL"}},
		{"no host", func(c *Config) { c.URL = "nats://" }, []string{"SYS1_NATS_URL"}},
		{"two auth methods", func(c *Config) { c.URL = "nats://x"; c.CredsFile = goodCreds; c.Token = "t" }, []string{"SYS1_NATS_CREDS"}},
		{"credentials in URL and user", func(c *Config) { c.URL = "nats://u:p@x"; c.User, c.Password = "u", "p" }, []string{"SYS1_NATS_USER"}},
		{"user without password", func(c *Config) { c.URL = "nats://x"; c.User = "u" }, []string{"SYS1_NATS_PASSWORD"}},
		{"password without user", func(c *Config) { c.URL = "nats://x"; c.Password = "p" }, []string{"SYS1_NATS_USER"}},
		{"cert without key", func(c *Config) { c.URL = "tls://x"; c.TLSCert = file }, []string{"SYS1_NATS_TLS_KEY"}},
		{"unreadable files", func(c *Config) { c.URL = "nats://x"; c.NKeyFile = missing; c.TLSCA = dir }, []string{"SYS1_NATS_NKEY", "SYS1_NATS_TLS_CA"}},
		{"creds with embedded", func(c *Config) { c.URL = ""; c.CredsFile = goodCreds }, []string{"SYS1_NATS_CREDS"}},
		{"not a creds file", func(c *Config) { c.URL = "nats://x"; c.CredsFile = file }, []string{"SYS1_NATS_CREDS"}},
		{"a creds file", func(c *Config) { c.URL = "nats://x"; c.CredsFile = goodCreds }, nil},
		{"bad listen", func(c *Config) { c.Listen = "4222" }, []string{"SYS1_NATS_LISTEN"}},
		{"empty data dir", func(c *Config) { c.DataDir = " " }, []string{"SYS1_DATA_DIR"}},
		{"payload too large", func(c *Config) { c.MaxPayload = 128 << 20 }, []string{"SYS1_NATS_MAX_PAYLOAD"}},
		{"wildcard inbox prefix", func(c *Config) { c.InboxPrefix = "_INBOX.*" }, []string{"SYS1_NATS_INBOX_PREFIX"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			errs := c.Validate()
			if len(errs) != len(tt.want) {
				t.Fatalf("want errors naming %v, got %v", tt.want, errs)
			}
			for i, e := range errs {
				if !strings.HasPrefix(e.Error(), tt.want[i]+":") {
					t.Fatalf("error %q does not start with %s", e, tt.want[i])
				}
				assertNoSecret(t, "u:p@", e.Error())
			}
		})
	}
	if got := RedactURLs("nats://user:pw@a:4222, tls://tok@b:4222"); strings.Contains(got, "pw") || strings.Contains(got, "tok") || !strings.Contains(got, "a:4222") {
		t.Fatalf("RedactURLs: %s", got)
	}
}

// TestReconnectSurvivesRepeatedAuthErrors: a server that refuses the credentials for a while
// after a restart (a password or account being rotated, an account resolver not loaded yet)
// must not end the connection for good. nats.go closes it after the same auth error twice
// in a row unless told otherwise; a worker would then sit connected to nothing until restarted.
func TestReconnectSurvivesRepeatedAuthErrors(t *testing.T) {
	const password = "rotating-password-value"
	store := t.TempDir()
	opts := func(pw string, port int) *server.Options {
		return &server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true, JetStream: true, StoreDir: store,
			Users: []*server.User{{Username: "sys1-worker", Password: pw}}}
	}
	start := func(o *server.Options) *server.Server {
		t.Helper()
		return natstest.Start(t, func(so *server.Options) { *so = *o })
	}
	s := start(opts(password, -1))
	port := s.Addr().(*net.TCPAddr).Port

	var logs natstest.Buffer
	cfg := remoteConfig(s)
	cfg.User, cfg.Password = "sys1-worker", password
	c, err := Connect(context.Background(), cfg, "t", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s.Shutdown()
	s.WaitForShutdown()

	// The server comes back refusing this password: several reconnects are refused.
	s2 := start(opts("another-password", port))
	waitFor(t, "three refused reconnects", func() bool {
		return strings.Count(strings.ToLower(logs.String()), "authorization violation") >= 3 || c.NC.IsClosed()
	})
	s2.Shutdown()
	s2.WaitForShutdown()
	if c.NC.IsClosed() {
		t.Fatalf("the connection gave up after repeated auth errors:\n%s", logs.String())
	}

	// Then it accepts it again: the connection is back without a restart.
	s3 := start(opts(password, port))
	defer func() { s3.Shutdown(); s3.WaitForShutdown() }()
	waitFor(t, "reconnect", func() bool { return c.NC.IsConnected() || c.NC.IsClosed() })
	if !c.NC.IsConnected() {
		t.Fatalf("not reconnected:\n%s", logs.String())
	}
	assertNoSecret(t, password, logs.String())
}

// The embedded server's durability is chosen, not inherited (issue 24): every write reaches
// the disk before JetStream acknowledges it unless SYS1_NATS_SYNC_INTERVAL says otherwise.
func TestEmbeddedServerSyncsEveryWriteByDefault(t *testing.T) {
	for _, tc := range []struct {
		setting string
		always  bool
		every   time.Duration
	}{{"", true, 2 * time.Minute}, {"always", true, 2 * time.Minute}, {"30s", false, 30 * time.Second}} {
		srv, err := StartEmbedded(EmbeddedOptions{Port: -1, StoreDir: t.TempDir(), SyncInterval: tc.setting})
		if err != nil {
			t.Fatal(err)
		}
		js := srv.JetStreamConfig()
		srv.Shutdown()
		srv.WaitForShutdown()
		if js == nil || js.SyncAlways != tc.always || js.SyncInterval != tc.every {
			t.Errorf("SyncInterval %q: JetStream config %+v; want always %v every %s", tc.setting, js, tc.always, tc.every)
		}
	}
	if _, err := StartEmbedded(EmbeddedOptions{Port: -1, StoreDir: t.TempDir(), SyncInterval: "sometimes"}); err == nil {
		t.Error("a bad sync interval was accepted")
	}
	cfg := DefaultConfig()
	cfg.SyncInterval = "-1s"
	if errs := cfg.Validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "SYS1_NATS_SYNC_INTERVAL") {
		t.Errorf("validation: %v", errs)
	}
}
