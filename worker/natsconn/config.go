package natsconn

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/sys1hq/sys1/contract"
)

// Config is how sys1 components reach NATS (environment SYS1_NATS_*). With SYS1_NATS_URL unset
// the component starts an embedded server instead (development and single-node use).
type Config struct {
	// URL is one server URL or a comma-separated list (nats://, tls://, ws://, wss://).
	URL string `env:"SYS1_NATS_URL"`

	// At most one way to authenticate: a creds file (operator/JWT mode), an nkey seed file,
	// user and password, or a token.
	CredsFile string `env:"SYS1_NATS_CREDS"`
	NKeyFile  string `env:"SYS1_NATS_NKEY"`
	User      string `env:"SYS1_NATS_USER"`
	Password  Secret `env:"SYS1_NATS_PASSWORD"`
	Token     Secret `env:"SYS1_NATS_TOKEN"`

	// TLS: a CA to verify the server and, for mutual TLS, a client certificate and its key.
	TLSCA   string `env:"SYS1_NATS_TLS_CA"`
	TLSCert string `env:"SYS1_NATS_TLS_CERT"`
	TLSKey  string `env:"SYS1_NATS_TLS_KEY"`

	// InboxPrefix replaces _INBOX for this connection's reply subjects. With the permissions of
	// deploy/nats a user may only subscribe to _INBOX.<user>.>, so that no one can read replies
	// meant for another user; set it to _INBOX.<user> there.
	InboxPrefix string `env:"SYS1_NATS_INBOX_PREFIX"`

	// PingInterval is how often the client pings the server; three unanswered pings mark the
	// connection stale and it reconnects. nats.go's 2 minutes would leave a replica behind a
	// silently dead connection (a NATS node lost without a reset) idle for 4–6 minutes.
	PingInterval time.Duration `env:"SYS1_NATS_PING_INTERVAL" envDefault:"20s"`

	// Embedded server (only when URL is empty).
	DataDir    string `env:"SYS1_DATA_DIR" envDefault:"./data"`
	Listen     string `env:"SYS1_NATS_LISTEN" envDefault:"127.0.0.1:4222"`
	MaxPayload int32  `env:"SYS1_NATS_MAX_PAYLOAD" envDefault:"8388608"`
	// SyncInterval is the embedded server's JetStream sync_interval: "always" (every write
	// reaches the disk before JetStream acknowledges it) or how often it flushes to disk
	// instead (a duration; nats-server's own default is 2m, which a power loss or kernel crash
	// can cost acknowledged messages). See deploy/performance.md for what "always" costs.
	SyncInterval string `env:"SYS1_NATS_SYNC_INTERVAL" envDefault:"always"`
}

// DefaultConfig is what env parsing yields with nothing set.
func DefaultConfig() Config {
	return Config{DataDir: "./data", Listen: "127.0.0.1:4222", MaxPayload: 8 << 20, PingInterval: 20 * time.Second, SyncInterval: SyncAlways}
}

// maxServerPayload is nats-server's hard limit for max_payload.
const maxServerPayload = 64 << 20

// Validate reports every bad variable, each error naming it. No error quotes a credential.
func (c *Config) Validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	urlHasUser := false
	if c.URL != "" {
		for _, raw := range strings.Split(c.URL, ",") {
			u, err := url.Parse(strings.TrimSpace(raw))
			if err != nil {
				add("SYS1_NATS_URL: an entry is not a URL")
				continue
			}
			switch u.Scheme {
			case "nats", "tls", "ws", "wss":
			default:
				add("SYS1_NATS_URL: %q must use nats://, tls://, ws:// or wss://", redact(u))
			}
			if u.Host == "" {
				add("SYS1_NATS_URL: %q has no host", redact(u))
			}
			urlHasUser = urlHasUser || u.User != nil
		}
	}

	// Each method set, and the variable an error about it names (one that is set).
	var methods, vars []string
	if c.CredsFile != "" {
		methods, vars = append(methods, "SYS1_NATS_CREDS"), append(vars, "SYS1_NATS_CREDS")
	}
	if c.NKeyFile != "" {
		methods, vars = append(methods, "SYS1_NATS_NKEY"), append(vars, "SYS1_NATS_NKEY")
	}
	if c.User != "" || c.Password != "" {
		v := "SYS1_NATS_USER"
		if c.User == "" {
			v = "SYS1_NATS_PASSWORD"
		}
		methods, vars = append(methods, "SYS1_NATS_USER/SYS1_NATS_PASSWORD"), append(vars, v)
	}
	if c.Token != "" {
		methods, vars = append(methods, "SYS1_NATS_TOKEN"), append(vars, "SYS1_NATS_TOKEN")
	}
	if urlHasUser {
		methods, vars = append(methods, "credentials in SYS1_NATS_URL"), append(vars, "SYS1_NATS_URL")
	}
	if len(methods) > 1 {
		add("%s: conflicting NATS authentication settings %s; set only one", vars[0], strings.Join(methods, ", "))
	}
	if c.User != "" && c.Password == "" {
		add("SYS1_NATS_PASSWORD: required with SYS1_NATS_USER")
	}
	if c.Password != "" && c.User == "" {
		add("SYS1_NATS_USER: required with SYS1_NATS_PASSWORD")
	}
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		add("SYS1_NATS_TLS_KEY: required with SYS1_NATS_TLS_CERT (client certificate and its key go together)")
	case c.TLSKey != "" && c.TLSCert == "":
		add("SYS1_NATS_TLS_CERT: required with SYS1_NATS_TLS_KEY (client certificate and its key go together)")
	}
	for _, f := range []struct{ name, path string }{
		{"SYS1_NATS_CREDS", c.CredsFile}, {"SYS1_NATS_NKEY", c.NKeyFile},
		{"SYS1_NATS_TLS_CA", c.TLSCA}, {"SYS1_NATS_TLS_CERT", c.TLSCert}, {"SYS1_NATS_TLS_KEY", c.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if err := readable(f.path); err != nil {
			add("%s: %v", f.name, err)
		}
	}
	if c.CredsFile != "" && readable(c.CredsFile) == nil {
		if err := checkCreds(c.CredsFile); err != nil {
			add("SYS1_NATS_CREDS: %v", err)
		}
	}
	if c.InboxPrefix != "" && (strings.ContainsAny(c.InboxPrefix, "*> \t") || strings.HasSuffix(c.InboxPrefix, ".") || strings.HasPrefix(c.InboxPrefix, ".")) {
		add("SYS1_NATS_INBOX_PREFIX: %q must be a subject without wildcards, spaces or a leading/trailing dot", c.InboxPrefix)
	}

	if c.URL == "" {
		// The embedded server is configured from these; remote servers configure themselves.
		for _, f := range []struct{ name, v string }{
			{"SYS1_NATS_CREDS", c.CredsFile}, {"SYS1_NATS_NKEY", c.NKeyFile},
			{"SYS1_NATS_TLS_CA", c.TLSCA}, {"SYS1_NATS_TLS_CERT", c.TLSCert},
		} {
			if f.v != "" {
				add("%s: applies to a remote server; set SYS1_NATS_URL (the embedded server supports only SYS1_NATS_USER/SYS1_NATS_PASSWORD or SYS1_NATS_TOKEN)", f.name)
			}
		}
		if strings.TrimSpace(c.DataDir) == "" {
			add("SYS1_DATA_DIR: must name a directory for the embedded server's JetStream store")
		}
		if _, _, err := splitListen(c.Listen); err != nil {
			add("SYS1_NATS_LISTEN: %v", err)
		}
		if _, _, err := ParseSyncInterval(c.SyncInterval); err != nil {
			add("SYS1_NATS_SYNC_INTERVAL: %v", err)
		}
	}
	if c.PingInterval < 100*time.Millisecond || c.PingInterval > 10*time.Minute {
		add("SYS1_NATS_PING_INTERVAL: must be between 100ms and 10m, got %s", c.PingInterval)
	}
	if c.MaxPayload < 1024 || c.MaxPayload > maxServerPayload {
		add("SYS1_NATS_MAX_PAYLOAD: must be between 1024 and %d bytes, got %d", maxServerPayload, c.MaxPayload)
	}
	return errs
}

// splitListen parses host:port; port -1 picks a free port (tests).
func splitListen(listen string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("%q is not host:port", listen)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("%q has an invalid port", listen)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// checkCreds verifies that a creds file holds a user JWT and an nkey seed, so a wrong file is
// a start-up error rather than an endless reconnect loop. The parse errors never quote the seed.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("cannot read %q: %w", path, unwrapPath(err))
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err == nil {
		_, err = jwt.DecodeUserClaims(tok)
	}
	if err != nil {
		return fmt.Errorf("%q holds no user JWT (not a NATS .creds file)", path)
	}
	kp, err := jwt.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("%q holds no user nkey seed (not a NATS .creds file)", path)
	}
	kp.Wipe()
	return nil
}

func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cannot read %q: %w", path, unwrapPath(err))
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return fmt.Errorf("%q is a directory", path)
	}
	return nil
}

// unwrapPath drops the *PathError wrapper so the path is not printed twice.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// redact renders u without userinfo (user, password or token) and without a query.
func redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	return c.String()
}

// RedactURLs renders a SYS1_NATS_URL value safe to log: every credential removed.
func RedactURLs(urls string) string {
	var out []string
	for _, raw := range strings.Split(urls, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			out = append(out, "<invalid URL>")
			continue
		}
		out = append(out, redact(u))
	}
	return strings.Join(out, ",")
}

// Secret is the one secret type of sys1's configuration: it never prints (see
// contract.Secret).
type Secret = contract.Secret

// SyncAlways is the sync_interval that makes JetStream write every message to disk before it
// acknowledges it: what sys1's shipped NATS configurations and its embedded server use.
const SyncAlways = "always"

// ParseSyncInterval reads a JetStream sync_interval: "always", or a positive duration between
// background flushes. Empty means "always".
func ParseSyncInterval(s string) (always bool, every time.Duration, err error) {
	switch strings.TrimSpace(s) {
	case "", SyncAlways:
		return true, 0, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return false, 0, fmt.Errorf("%q is neither %q nor a positive duration (e.g. 2m)", s, SyncAlways)
	}
	return false, d, nil
}
