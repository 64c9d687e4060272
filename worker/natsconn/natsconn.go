// Package natsconn connects sys1 components to NATS JetStream: to a configured server (creds
// file, nkey, user/password or token; TLS), or, with SYS1_NATS_URL unset, to an embedded
// nats-server it starts itself so a newcomer needs nothing else.
//
// Connections reconnect forever with a capped, jittered backoff and log every disconnect and
// reconnect. Credential values (passwords, tokens, nkey seeds, creds) are never logged nor put in
// an error: URLs are logged with their userinfo removed and Config's secrets do not print.
package natsconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Conn is a NATS connection with its JetStream context, and the embedded server behind it, if
// one was started.
type Conn struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// Embedded is the server Connect started (SYS1_NATS_URL unset), nil otherwise.
	Embedded *server.Server

	log       zerolog.Logger
	closed    chan struct{}
	closeOnce sync.Once
}

// drainTimeout bounds Close: in-flight handlers get this long to finish before the
// connection is closed regardless.
const drainTimeout = 20 * time.Second

// Close drains the connection (subscriptions finish their in-flight messages, pending
// publishes are flushed), then shuts down the embedded server if Connect started one.
// Safe to call more than once.
func (c *Conn) Close() {
	c.closeOnce.Do(func() {
		if err := c.NC.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			c.log.Warn().Err(err).Msg("NATS drain failed; closing")
			c.NC.Close()
		}
		select {
		case <-c.closed:
		case <-time.After(drainTimeout + 5*time.Second):
			c.log.Warn().Msg("NATS drain did not finish in time; closing")
			c.NC.Close()
		}
		if c.Embedded != nil {
			c.Embedded.Shutdown()
			c.Embedded.WaitForShutdown()
			c.log.Info().Msg("embedded NATS server stopped")
		}
	})
}

// Connect validates cfg and connects, starting an embedded server first when cfg.URL is empty.
// name identifies the client in server monitoring (e.g. "sys1-worker <host>"). A server that
// cannot be reached yet is retried with backoff until ctx ends; a rejected credential is
// returned at once, since retrying cannot fix it.
func Connect(ctx context.Context, cfg Config, name string, log zerolog.Logger) (*Conn, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("nats configuration: %w", errors.Join(errs...))
	}
	log = log.With().Str("nats_client", name).Logger()

	var embedded *server.Server
	urls := cfg.URL
	if urls == "" {
		host, port, _ := splitListen(cfg.Listen)
		storeDir, err := filepath.Abs(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("SYS1_DATA_DIR %q: %w", cfg.DataDir, err)
		}
		embedded, err = StartEmbedded(EmbeddedOptions{
			Host: host, Port: port, StoreDir: storeDir, MaxPayload: cfg.MaxPayload, SyncInterval: cfg.SyncInterval,
			User: cfg.User, Password: cfg.Password.Reveal(), Token: cfg.Token.Reveal(), Logger: &log,
		})
		if err != nil {
			return nil, err
		}
		urls = embedded.ClientURL()
		ev := log.Info().Str("url", urls).Str("store_dir", filepath.Join(storeDir, "jetstream")).Int32("max_payload", cfg.MaxPayload)
		if cfg.User == "" && cfg.Token == "" {
			ev.Msg("started an embedded NATS server with JetStream (no authentication: development use); connect other terminals with SYS1_NATS_URL=" + urls + " or: nats --server " + urls)
		} else {
			ev.Msg("started an embedded NATS server with JetStream (authentication required); connect other terminals with SYS1_NATS_URL=" + urls)
		}
		if ip := net.ParseIP(host); cfg.User == "" && cfg.Token == "" && (ip == nil || !ip.IsLoopback()) && host != "localhost" {
			log.Warn().Str("listen", cfg.Listen).Msg("the embedded NATS server accepts unauthenticated clients on a non-loopback address; set SYS1_NATS_USER/SYS1_NATS_PASSWORD or listen on 127.0.0.1")
		}
	}

	nc, closed, err := dial(ctx, cfg, urls, name, log)
	if err != nil {
		if embedded != nil {
			embedded.Shutdown()
			embedded.WaitForShutdown()
		}
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		if embedded != nil {
			embedded.Shutdown()
			embedded.WaitForShutdown()
		}
		return nil, fmt.Errorf("nats: JetStream context: %w", err)
	}
	if mp := nc.MaxPayload(); mp < int64(cfg.MaxPayload) {
		log.Warn().Int64("server_max_payload", mp).Int32("wanted", cfg.MaxPayload).
			Msg("the NATS server's max_payload is smaller than SYS1_NATS_MAX_PAYLOAD; larger requests and replies will be refused")
	}
	return &Conn{NC: nc, JS: js, Embedded: embedded, log: log, closed: closed}, nil
}

// dial connects with the options of cfg, retrying transient failures until ctx ends.
func dial(ctx context.Context, cfg Config, urls, name string, log zerolog.Logger) (*nats.Conn, chan struct{}, error) {
	safeURL := RedactURLs(urls)
	for attempt := 1; ; attempt++ {
		closed := make(chan struct{})
		opts, err := options(cfg, name, log, closed)
		if err != nil {
			return nil, nil, err
		}
		nc, err := nats.Connect(urls, opts...)
		if err == nil {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Str("server_id", nc.ConnectedServerId()).Msg("connected to NATS")
			return nc, closed, nil
		}
		if permanent(err) {
			return nil, nil, fmt.Errorf("nats %s: connect rejected: %w (check the NATS credentials in SYS1_NATS_*)", safeURL, err)
		}
		wait := backoff(attempt)
		log.Warn().Err(err).Str("url", safeURL).Int("attempt", attempt).Dur("retry_in", wait).Msg("cannot reach NATS yet; retrying")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, fmt.Errorf("nats %s: connect: %w (gave up: %w)", safeURL, err, ctx.Err())
		case <-t.C:
		}
	}
}

// permanent reports errors no retry can fix: rejected or malformed credentials and a server
// certificate that does not verify (wrong CA or host name).
func permanent(err error) bool {
	for _, e := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		nats.ErrNkeysNotSupported, nats.ErrSecureConnRequired, nats.ErrSecureConnWanted} {
		if errors.Is(err, e) {
			return true
		}
	}
	var (
		pe       *os.PathError
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &pe) || errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// backoff grows from 250ms to 10s, with ±20% jitter so replicas do not reconnect in lockstep.
func backoff(attempt int) time.Duration {
	d := 250 * time.Millisecond << min(attempt-1, 6)
	d = min(d, 10*time.Second)
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// maxPingsOut is how many unanswered pings make a connection stale (see PingInterval).
const maxPingsOut = 3

func options(cfg Config, name string, log zerolog.Logger, closed chan struct{}) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(backoff),
		nats.PingInterval(cfg.PingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		// nats.go otherwise closes the connection for good after the same auth error twice in
		// a row while reconnecting (a server back before its accounts, a credential being
		// rotated), leaving a live process with no connection. The first connect still fails
		// at once on a rejected credential (see permanent).
		nats.IgnoreAuthErrorAbort(),
		nats.DrainTimeout(drainTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("disconnected from NATS; reconnecting")
			} else {
				log.Info().Msg("disconnected from NATS")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("reconnected to NATS")
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Info().Msg("NATS connection closed")
			close(closed)
		}),
		nats.LameDuckModeHandler(func(*nats.Conn) {
			log.Warn().Msg("NATS server entering lame duck mode; will move to another server")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Error().Err(err)
			if sub != nil {
				ev = ev.Str("subscription", sub.Subject)
			}
			ev.Msg("NATS asynchronous error")
		}),
	}
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			// The nkeys library's error text never includes the seed; the path is not secret.
			return nil, fmt.Errorf("SYS1_NATS_NKEY: %q is not an nkey seed file: %w", cfg.NKeyFile, err)
		}
		opts = append(opts, opt)
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password.Reveal()))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token.Reveal()))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	if cfg.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	return opts, nil
}

// EmbeddedOptions configures StartEmbedded.
type EmbeddedOptions struct {
	Host       string // default 127.0.0.1
	Port       int    // -1 picks a free port; 0 means the NATS default 4222
	StoreDir   string // JetStream file store (a "jetstream" directory is created inside); required
	MaxPayload int32  // default 8 MiB
	// Optional client authentication: user and password, or a token.
	User, Password, Token string
	// SyncInterval is JetStream's sync_interval (ParseSyncInterval): "always" unless said
	// otherwise; with a ConfigFile and no SyncInterval, the file's setting stands.
	SyncInterval string
	// ConfigFile, when set, is loaded first (nats-server.conf syntax); the fields above then
	// override its listen address and store directory. Tests load deploy/nats with it.
	ConfigFile string
	// Logger receives the server's notices (debug), warnings and errors; nil discards them.
	Logger *zerolog.Logger
	// ReadyTimeout bounds the wait for the server to accept clients; default 10s.
	ReadyTimeout time.Duration
}

// embeddedMaxStore is the embedded server's JetStream storage limit (see StartEmbedded).
const embeddedMaxStore = 1 << 40

// StartEmbedded starts an in-process nats-server with JetStream and waits until it accepts
// clients. The caller owns it: Shutdown, then WaitForShutdown.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("embedded NATS server: a JetStream store directory is required")
	}
	opts := &server.Options{}
	if o.ConfigFile != "" {
		var err error
		if opts, err = server.ProcessConfigFile(o.ConfigFile); err != nil {
			return nil, fmt.Errorf("embedded NATS server: config %s: %w", o.ConfigFile, err)
		}
	}
	opts.Host = o.Host
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	opts.Port = o.Port
	opts.JetStream = true
	opts.StoreDir = o.StoreDir
	if o.ConfigFile == "" && opts.JetStreamMaxStore == 0 {
		// By default nats-server may reserve three quarters of the disk's free space for
		// stream limits, and sys1's limits add up to 23.7 GiB: a development machine with
		// less free disk would refuse to create the streams. The limits still bound what
		// sys1 stores; this only stops the reservation from failing.
		opts.JetStreamMaxStore = embeddedMaxStore
	}
	opts.NoSigs = true // the component handles signals and shuts the server down itself
	opts.HTTPPort = 0
	if o.ConfigFile == "" || o.MaxPayload > 0 {
		opts.MaxPayload = o.MaxPayload
		if opts.MaxPayload <= 0 {
			opts.MaxPayload = 8 << 20
		}
	}
	if opts.ServerName == "" {
		opts.ServerName = "sys1-embedded"
	}
	if o.ConfigFile == "" || o.SyncInterval != "" {
		// Durability is chosen, not inherited: nats-server's default flushes every two
		// minutes, and a power loss then loses messages JetStream had acknowledged.
		always, every, err := ParseSyncInterval(o.SyncInterval)
		if err != nil {
			return nil, fmt.Errorf("embedded NATS server: sync interval: %w", err)
		}
		opts.SyncAlways, opts.SyncInterval = always, every
		if always {
			opts.SyncInterval = 2 * time.Minute // unused while every write syncs; nats-server's value
		}
	}
	switch {
	case o.User != "":
		opts.Username, opts.Password = o.User, o.Password
	case o.Token != "":
		opts.Authorization = o.Token
	}
	if err := os.MkdirAll(o.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded NATS server: store directory: %w", err)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	if o.Logger != nil {
		// "subsystem", not "component": the logger already names the component (worker), and
		// a JSON line must not carry one key twice.
		s.SetLogger(serverLogger{o.Logger.With().Str("subsystem", "nats-server").Logger()}, false, false)
	}
	s.Start()
	ready := o.ReadyTimeout
	if ready <= 0 {
		ready = 10 * time.Second
	}
	if !s.ReadyForConnections(ready) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS server: not ready to accept clients on %s within %s (port in use? set SYS1_NATS_LISTEN or SYS1_NATS_URL)",
			net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), ready)
	}
	return s, nil
}

// serverLogger routes nats-server's log into zerolog. Notices (a screenful at every start) go
// to debug; the server's own texts never carry client passwords.
type serverLogger struct{ log zerolog.Logger }

func (l serverLogger) Noticef(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
func (l serverLogger) Warnf(format string, v ...any)   { l.log.Warn().Msgf(format, v...) }
func (l serverLogger) Fatalf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l serverLogger) Errorf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l serverLogger) Debugf(format string, v ...any)  { l.log.Trace().Msgf(format, v...) }
func (l serverLogger) Tracef(format string, v ...any)  { l.log.Trace().Msgf(format, v...) }

// RunServer runs a nats-server from a configuration file, as `nats-server -c FILE` does, until
// ctx ends, logging to standard error. `sys1 soak` runs its NATS nodes with it, so the nodes it
// kills are the nats-server go.mod requires, with no second binary to install.
func RunServer(ctx context.Context, configFile string) error {
	opts, err := server.ProcessConfigFile(configFile)
	if err != nil {
		return fmt.Errorf("nats-server config %s: %w", configFile, err)
	}
	opts.ConfigFile = configFile
	opts.NoSigs = true // ctx carries SIGTERM and SIGINT
	opts.Logtime = true
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	s.ConfigureLogger()
	s.Start()
	if !s.ReadyForConnections(60 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("nats-server: not ready for connections within 60s")
	}
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}
