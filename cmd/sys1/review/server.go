// Package review is `sys1 review`: the web page where people label the questions the policy
// sent to review. It reads review items from SYS1_REVIEW (see index.go), shows a queue and
// one item at a time, and publishes each reviewer's label to sys1.labels.<caller>.accepted
// after winning the item in the review bucket (see labels.go).
//
// Pages are rendered on the server with html/template (every value escaped for its context);
// a small script adds keyboard shortcuts and nothing depends on it. Reviewers log in against
// an htpasswd file of bcrypt hashes; sessions live in a KV bucket so any replica serves any
// reviewer; every form carries a CSRF token and cross-origin POSTs are refused outright.
package review

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/livefile"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/topology"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config is the review page's configuration (plain values; the command reads SYS1_REVIEW_*).
type Config struct {
	// Addr is the listen address. Without TLS it must be a loopback address (CheckListen).
	Addr string
	// TLSCertFile and TLSKeyFile serve HTTPS (both or neither).
	TLSCertFile, TLSKeyFile string
	// UsersFile is the htpasswd file of reviewers (bcrypt only); it is re-read when it changes.
	UsersFile string
	// SessionTTL is how long a login lasts.
	SessionTTL time.Duration
	// StateLimit is how many bytes of an item's state the page shows; InstructionsLimit the
	// same for its instructions.
	StateLimit, InstructionsLimit int
	// Topology names the review stream, the labels stream and the review bucket.
	Topology topology.Config
	// SessionsBucket is the KV bucket of sessions.
	SessionsBucket string
	// RecoverAfter is how long a label may stay saved-but-unpublished before any replica
	// republishes it; RecoverEvery how often replicas look.
	RecoverAfter, RecoverEvery time.Duration
	// MaxItemBytes bounds what the item reader buffers (at least the largest item).
	MaxItemBytes int
	// UsersReload is how often the users file is checked for changes.
	UsersReload time.Duration
	// StallCheck is how often the item reader is checked for having stopped while the review
	// stream holds newer items (it is then restarted after the last item read).
	StallCheck time.Duration
	// PruneEvery is how often a replica drops aged-out items from its index and removes from
	// the stream the review messages whose items are all labelled.
	PruneEvery time.Duration
	// TrustedProxies are the proxies (a TLS terminator, a load balancer) whose
	// X-Forwarded-For names the client: sign-in throttling counts by the client's address,
	// not the proxy's (SYS1_REVIEW_TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
}

// DefaultConfig is the configuration with every default in place.
func DefaultConfig() Config {
	return Config{Addr: "127.0.0.1:8090", SessionTTL: 12 * time.Hour, StateLimit: 64 << 10, InstructionsLimit: 16 << 10,
		Topology: topology.Default(), SessionsBucket: "sys1-review-sessions",
		RecoverAfter: 30 * time.Second, RecoverEvery: 10 * time.Second, MaxItemBytes: 8 << 20, UsersReload: 2 * time.Second,
		StallCheck: 30 * time.Second, PruneEvery: time.Minute}
}

// CheckListen refuses a listen address reachable from other machines when there is no TLS:
// passwords and session cookies would cross the network in clear text.
func CheckListen(addr string, withTLS bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (e.g. 127.0.0.1:8090): %v", addr, err)
	}
	if withTLS {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	if host == "" {
		host = "every interface"
	}
	return fmt.Errorf("%s listens on %s without TLS; reviewers' passwords and sessions would travel in clear text: listen on 127.0.0.1 (behind a TLS proxy) or set SYS1_REVIEW_TLS_CERT and SYS1_REVIEW_TLS_KEY", addr, host)
}

// Server is one replica of the review page.
type Server struct {
	cfg      Config
	js       jetstream.JetStream
	stream   jetstream.Stream
	users    *livefile.File[Users]
	sessions *sessionStore
	idx      *index
	lab      *labeller
	throttle *throttle
	pages    map[string]*template.Template
	log      zerolog.Logger
	now      func() time.Time
	secure   bool // served over TLS: Secure cookies, HSTS
	// registry is served on /metrics (metrics.go): the queue's figures, Go and process.
	registry *prometheus.Registry

	bcryptSlots chan struct{} // bounds concurrent password checks (bcrypt is CPU-bound)
	fetchSlots  chan struct{} // bounds concurrent full-item reads (items can be megabytes)
}

// New loads the users file, ensures the streams and buckets the page uses, and prepares the
// server; Run (or ListenAndServe) starts it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (*Server, error) {
	if cfg.StallCheck <= 0 {
		cfg.StallCheck = DefaultConfig().StallCheck
	}
	if cfg.PruneEvery <= 0 {
		cfg.PruneEvery = DefaultConfig().PruneEvery
	}
	users, err := livefile.Load(cfg.UsersFile, ParseUsers)
	if err != nil {
		return nil, fmt.Errorf("reviewers file: %w", err)
	}
	for _, w := range users.Current().Weak {
		log.Warn().Str("file", cfg.UsersFile).Msg("weak password hash: " + w + "; re-create it with `htpasswd -B -C 12` or `sys1 review --hash-password`")
	}
	stream, err := ensureStream(ctx, js, cfg.Topology.ReviewStreamConfig())
	if err != nil {
		return nil, err
	}
	if _, err := ensureStream(ctx, js, cfg.Topology.LabelsStreamConfig()); err != nil {
		return nil, err
	}
	kv, err := topology.EnsureKeyValue(ctx, js, cfg.Topology.ReviewBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("review bucket %s: %w", cfg.Topology.ReviewBucket, err)
	}
	skv, err := topology.EnsureKeyValue(ctx, js, SessionsBucketConfig(cfg.SessionsBucket, cfg.SessionTTL, cfg.Topology.Replicas, int64(cfg.Topology.ReviewSessionsMaxBytes)))
	if err != nil {
		return nil, fmt.Errorf("sessions bucket %s: %w", cfg.SessionsBucket, err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	now := time.Now
	idx := newIndex(log)
	s := &Server{
		cfg: cfg, js: js, stream: stream, users: users, idx: idx, pages: pages, log: log, now: now,
		sessions:    &sessionStore{kv: skv, ttl: cfg.SessionTTL, now: now},
		lab:         &labeller{js: js, kv: kv, idx: idx, now: now, recoverAfter: cfg.RecoverAfter, log: log},
		throttle:    newThrottle(now),
		secure:      cfg.TLSCertFile != "",
		bcryptSlots: make(chan struct{}, 2),
		fetchSlots:  make(chan struct{}, 4),
		registry:    newRegistry(idx),
	}
	return s, nil
}

// ensureStream creates a stream sys1 owns when it is missing; an existing one is left as the
// workers configured it.
func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, sc.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, sc)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", sc.Name, err)
	}
	return s, nil
}

// Run keeps the index, the labels and the users file current and republishes saved labels
// until ctx ends.
func (s *Server) Run(ctx context.Context) {
	done := make(chan struct{}, 5)
	run := func(f func()) {
		go func() { defer func() { done <- struct{}{} }(); f() }()
	}
	run(func() {
		s.idx.followItems(ctx, s.js, s.cfg.Topology.ReviewStream, 2*s.cfg.MaxItemBytes, s.cfg.StallCheck)
	})
	run(func() { s.idx.followLabels(ctx, s.lab.kv) })
	run(func() { s.idx.pruneAged(ctx, s.js, s.cfg.Topology.ReviewStream, s.cfg.PruneEvery, true) })
	run(func() { s.lab.recoverLoop(ctx, s.cfg.RecoverEvery) })
	run(func() {
		s.users.Watch(ctx, s.cfg.UsersReload, func(u Users) {
			s.log.Info().Str("file", s.cfg.UsersFile).Int("users", u.Len()).Msg("reviewers file reloaded")
		}, func(err error) {
			s.log.Error().Err(err).Str("file", s.cfg.UsersFile).Msg("reviewers file edit refused; the last good version stays in force")
		})
	})
	for range 5 {
		<-done
	}
}

// Ready reports whether the index has caught up with the stream and the bucket.
func (s *Server) Ready() bool { return s.idx.ready() }

// ListenAndServe runs the server on cfg.Addr (HTTPS with a certificate) until ctx ends, then
// shuts down gracefully. A listen failure is returned at once.
func (s *Server) ListenAndServe(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is ListenAndServe on a listener of the caller's.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          nil,
	}
	if s.secure {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("TLS certificate: %w", err)
		}
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	background := make(chan struct{})
	go func() { defer close(background); s.Run(rctx) }()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	scheme := "http"
	if s.secure {
		scheme = "https"
	}
	s.log.Info().Str("url", scheme+"://"+ln.Addr().String()).Msg("review page serving")
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		sctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		err = srv.Shutdown(sctx)
		stop()
		<-served
	}
	cancel()
	<-background
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	s.log.Info().Msg("review page stopped")
	return err
}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"percent":   func(p float64) string { return fmt.Sprintf("%.1f%%", 100*p) },
		"ago":       ago,
		"utc":       func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"itemURL":   func(id string, q query) string { return itemURL(id, q, nil) },
		"labelText": labelText,
		// clip cuts a name for display (a name may be 64 KiB); the whole name goes in a title.
		"clip": func(s string, n int) string { return clip(s, n) },
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "queue", "item", "message"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

// Handler is the review page's HTTP handler: security headers on every response, and
// cross-origin POSTs refused before any handler runs.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	notFound := func(w http.ResponseWriter, r *http.Request) {
		s.message(w, r, nil, http.StatusNotFound, "Not found", "There is no page at this address.")
	}
	mux.Handle("GET /static/", http.StripPrefix("/static/", staticHandler(static, http.HandlerFunc(notFound))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "catching up with the review stream", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	// The queue's totals for Prometheus (metrics.go), like /healthz without a session: they
	// name no caller, question or item.
	mux.Handle("GET /metrics", metrics.Handler(s.registry, s.log))
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.withSession(s.logout))
	mux.HandleFunc("GET /{$}", s.withSession(s.queuePage))
	mux.HandleFunc("GET /next", s.withSession(s.next))
	mux.HandleFunc("GET /items/{id}", s.withSession(s.itemPage))
	mux.HandleFunc("POST /items/{id}/label", s.withSession(s.submit))
	mux.HandleFunc("/", notFound)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.Warn().Str("path", r.URL.Path).Str("origin", r.Header.Get("Origin")).Msg("cross-origin request refused")
		s.message(w, r, nil, http.StatusForbidden, "Refused", "This request came from another site and was refused.")
	}))
	return s.securityHeaders(cop.Handler(mux))
}

// staticHandler serves the embedded CSS, script and icon; they change only with the binary.
// Only files: a directory (/static/ itself) is not listed but not found, like any name that
// is not one of the files.
func staticHandler(fsys fs.FS, notFound http.Handler) http.Handler {
	files := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st, err := fs.Stat(fsys, strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/")); err != nil || st.IsDir() {
			notFound.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})
}

// contentSecurityPolicy allows nothing but this origin's own files: no inline script or
// style, no frames, forms only to this origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func (s *Server) securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cross-Origin-Resource-Policy", "same-origin")
		hd.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
		if s.secure {
			hd.Set("Strict-Transport-Security", "max-age=31536000")
		}
		h.ServeHTTP(w, r)
	})
}

// wellFormedItemID reports whether id could be a contract.ReviewItemID.
func wellFormedItemID(id string) bool {
	if len(id) != 35 || !strings.HasPrefix(id, "rv-") {
		return false
	}
	for _, c := range id[3:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// fetch reads the full item at seq and checks that it is the item id.
func (s *Server) fetch(ctx context.Context, seq uint64, id string) (*contract.ReviewItem, *itemMeta, error) {
	select {
	case s.fetchSlots <- struct{}{}:
		defer func() { <-s.fetchSlots }()
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := s.stream.GetMsg(fctx, seq)
	if err != nil {
		return nil, nil, err
	}
	rr, _, err := contract.DecodeReviewMessage(msg.Data)
	if err != nil {
		return nil, nil, err
	}
	for _, it := range rr.Expand() {
		if it.ID != id {
			continue
		}
		m, err := metaOf(&it, msg.Subject, seq)
		if err != nil {
			return nil, nil, err
		}
		return &it, m, nil
	}
	return nil, nil, fmt.Errorf("stream sequence %d holds no item %s", seq, id)
}
