package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/cmd/sys1/review"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/startup"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "review", summary: "serve the review page where people label abstained answers", run: runReview})
}

// stdin is where --hash-password reads the password (a variable for tests).
var stdin io.Reader = os.Stdin

// ReviewConfig is the review page's environment. The listen address is the --http flag.
type ReviewConfig struct {
	UsersFile  string        `env:"SYS1_REVIEW_USERS"`
	TLSCert    string        `env:"SYS1_REVIEW_TLS_CERT"`
	TLSKey     string        `env:"SYS1_REVIEW_TLS_KEY"`
	SessionTTL time.Duration `env:"SYS1_REVIEW_SESSION_TTL" envDefault:"12h"`
	StateLimit int           `env:"SYS1_REVIEW_STATE_LIMIT" envDefault:"65536"`
	// TrustedProxies are the proxies whose X-Forwarded-For names the client (sign-in
	// throttling counts by client address); the sessions bucket's name and size are the
	// topology's (SYS1_REVIEW_SESSIONS_BUCKET, SYS1_REVIEW_SESSIONS_MAX_BYTES).
	TrustedProxies string `env:"SYS1_REVIEW_TRUSTED_PROXIES"`
}

// Validate checks every variable, the users file and the certificate included, so a bad
// deployment fails at start with every problem named.
func (c *ReviewConfig) Validate() []error {
	var errs []error
	if c.UsersFile == "" {
		errs = append(errs, errors.New("SYS1_REVIEW_USERS is not set: name an htpasswd file of bcrypt hashes (create lines with `sys1 review --hash-password NAME` or `htpasswd -B -C 12`)"))
	} else if data, err := os.ReadFile(c.UsersFile); err != nil {
		errs = append(errs, fmt.Errorf("SYS1_REVIEW_USERS: %v", err))
	} else if _, err := review.ParseUsers(data); err != nil {
		errs = append(errs, fmt.Errorf("SYS1_REVIEW_USERS: %s: %v", c.UsersFile, err))
	}
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		errs = append(errs, errors.New("SYS1_REVIEW_TLS_CERT and SYS1_REVIEW_TLS_KEY: set both or neither"))
	case c.TLSCert != "":
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			errs = append(errs, fmt.Errorf("SYS1_REVIEW_TLS_CERT: cannot load the certificate and key: %v", err))
		}
	}
	if c.SessionTTL < time.Minute || c.SessionTTL > 30*24*time.Hour {
		errs = append(errs, fmt.Errorf("SYS1_REVIEW_SESSION_TTL: must be between 1m and 720h, got %s", c.SessionTTL))
	}
	if c.StateLimit < 1024 || c.StateLimit > 8<<20 {
		errs = append(errs, fmt.Errorf("SYS1_REVIEW_STATE_LIMIT: must be between 1024 and %d bytes, got %d", 8<<20, c.StateLimit))
	}
	if _, err := review.ParseTrustedProxies(c.TrustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("SYS1_REVIEW_TRUSTED_PROXIES: %v", err))
	}
	return errs
}

func reviewUsage(w io.Writer) {
	fmt.Fprint(w, `usage: sys1 review [--http 127.0.0.1:8090]
       sys1 review --hash-password NAME   (reads the password from standard input, prints an htpasswd line)

Serves the review page. Configuration is by environment: SYS1_REVIEW_USERS (htpasswd file,
bcrypt only; required), SYS1_REVIEW_TLS_CERT and SYS1_REVIEW_TLS_KEY (HTTPS; without them only
a loopback address may be used), SYS1_REVIEW_SESSION_TTL, SYS1_REVIEW_STATE_LIMIT,
SYS1_REVIEW_SESSIONS_BUCKET, SYS1_REVIEW_SESSIONS_MAX_BYTES, SYS1_REVIEW_TRUSTED_PROXIES (the
proxies whose X-Forwarded-For names the client), and the NATS and stream settings (SYS1_NATS_*, SYS1_REVIEW_STREAM,
SYS1_LABELS_STREAM, SYS1_REVIEW_BUCKET). See README.md.

flags:
`)
}

func runReview(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("review", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { reviewUsage(stderr); fs.PrintDefaults() }
	addr := fs.String("http", "127.0.0.1:8090", "listen address of the review page")
	hashFor := fs.String("hash-password", "", "print an htpasswd line for this user name (password read from standard input) and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sys1 review: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return exitUsage
	}
	if *hashFor != "" {
		return hashPassword(*hashFor, stdout, stderr)
	}

	var (
		logCfg  LogConfig
		natsCfg = natsconn.DefaultConfig()
		topo    = topology.Default()
		cfg     ReviewConfig
	)
	natsCfg.URL = defaultClientURL() // a client of the workers' NATS, never an embedded server
	listenCheck := check(func() []error {
		if err := review.CheckListen(*addr, cfg.TLSCert != "" && cfg.TLSKey != ""); err != nil {
			return []error{fmt.Errorf("--http: %v", err)}
		}
		return nil
	})
	if err := loadConfig(&logCfg, &natsCfg, &topo, &cfg, listenCheck); err != nil {
		fmt.Fprintln(stderr, "sys1 review:", err)
		return exitUsage
	}
	log := newLogger(stderr, logCfg, "review")
	host, _ := os.Hostname()
	nc, err := natsconn.Connect(ctx, natsCfg, "sys1-review "+host, log)
	if err != nil {
		if ctx.Err() != nil {
			log.Info().Msg("review page stopped before connecting to NATS")
			return exitOK
		}
		log.Error().Err(err).Str("nats_url", natsconn.RedactURLs(natsCfg.URL)).Msg("cannot connect to NATS")
		return exitUsage
	}
	defer nc.Close()

	rc := review.DefaultConfig()
	rc.Addr, rc.TLSCertFile, rc.TLSKeyFile, rc.UsersFile = *addr, cfg.TLSCert, cfg.TLSKey, cfg.UsersFile
	rc.SessionTTL, rc.StateLimit, rc.SessionsBucket, rc.Topology = cfg.SessionTTL, cfg.StateLimit, topo.ReviewSessionsBucket, topo
	rc.TrustedProxies, _ = review.ParseTrustedProxies(cfg.TrustedProxies) // validated above
	rc.MaxItemBytes = max(int(topo.MaxMsgSize), int(nc.NC.MaxPayload()))
	// The page's streams and buckets are set up before it serves. While NATS fails over that
	// waits (startup.Retry), and the address answers meanwhile: /healthz ok (alive), /readyz
	// and every page 503, saying what it waits for.
	waiting, err := serveWhileStarting(rc, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot serve the review page")
		return exitUsage
	}
	var srv *review.Server
	setUp := startup.Retry{What: "the review page's streams and buckets", Log: log, LastError: nc.NC.LastError,
		OnWait: func(err error, wait time.Duration) {
			waiting.Waiting(fmt.Sprintf("waiting for JetStream (next try in %s): %v", wait.Round(time.Millisecond), err))
		}}
	err = setUp.Do(ctx, func(tctx context.Context) error {
		var err error
		srv, err = review.New(tctx, nc.JS, rc, log)
		return err
	})
	waiting.stop()
	if err != nil {
		if ctx.Err() != nil {
			log.Info().Err(err).Msg("review page stopped before its streams were set up")
			return exitOK
		}
		log.Error().Err(err).Msg("cannot start the review page")
		return exitUsage
	}
	if err := srv.ListenAndServe(ctx); err != nil {
		log.Error().Err(err).Msg("review page failed")
		return exitFailed
	}
	return exitOK
}

// hashPassword prints "name:bcrypt-hash" for the password on the first line of stdin.
func hashPassword(name string, stdout, stderr io.Writer) int {
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(stderr, "sys1 review --hash-password: reading the password:", err)
		return exitUsage
	}
	password := strings.TrimRight(line, "\r\n")
	out, err := review.HashPassword(name, password)
	if err != nil {
		fmt.Fprintln(stderr, "sys1 review --hash-password:", err)
		return exitUsage
	}
	fmt.Fprintln(stdout, out)
	return exitOK
}

// startingPage answers on the review page's address while its set-up waits for NATS.
type startingPage struct {
	*startingEndpoints
	stop func()
}

// serveWhileStarting listens on the page's address (with its TLS, when configured) and serves
// startingEndpoints until stop; ListenAndServe then listens on the same address again.
func serveWhileStarting(rc review.Config, log zerolog.Logger) (*startingPage, error) {
	ln, err := net.Listen("tcp", rc.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", rc.Addr, err)
	}
	e := newStartingEndpoints(prometheus.NewRegistry(), log)
	e.Waiting("setting up the review streams and buckets")
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			e.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "5")
		http.Error(w, "The review page is starting: it waits for NATS. Try again in a few seconds.", http.StatusServiceUnavailable)
	}))
	if rc.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(rc.TLSCertFile, rc.TLSKeyFile)
		if err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("TLS certificate: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}})
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	var once sync.Once
	return &startingPage{startingEndpoints: e, stop: func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
			<-done
		})
	}}, nil
}
