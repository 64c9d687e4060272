package sink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink/migrate"
)

// RecordState says what is kept of the caller's content: the request's state and every
// question's instructions (contract.RecordState has the exact stored forms). Workers apply it
// where the record is made; the sink applies it again on the way into ClickHouse, which
// changes nothing for a record already in that form and makes a laxer one stricter.
type RecordState = contract.RecordState

// The SYS1_RECORD_STATE modes.
const (
	// RecordFull stores state and instructions as they arrived.
	RecordFull = contract.RecordFull
	// RecordHash replaces each with the JSON string of its sha256 hex: runs stay comparable
	// ("same state as yesterday?") without keeping the content.
	RecordHash = contract.RecordHash
	// RecordNone replaces each with JSON null.
	RecordNone = contract.RecordNone
)

// Config is the sink's and the migrator's configuration (environment SYS1_*).
type Config struct {
	// DSN of ClickHouse: clickhouse://host:9000[/db] (native) or http(s)://host:8123 (HTTP).
	// Empty means "no sink" for `sys1 worker`; `sys1 sink` and `sys1 migrate` require it.
	DSN string `env:"SYS1_CLICKHOUSE_DSN"`
	// Database holding the sys1 tables (created by Migrate).
	Database string `env:"SYS1_CLICKHOUSE_DATABASE" envDefault:"sys1"`
	// Cluster, when set, names the ClickHouse cluster (remote_servers) the schema lives on:
	// migrations run ON CLUSTER with Replicated* tables and Distributed tables over them,
	// and inserts wait until every shard has its rows. Needs ClickHouse Keeper (or ZooKeeper)
	// and the {shard} and {replica} macros on every node.
	Cluster string `env:"SYS1_CLICKHOUSE_CLUSTER"`
	// RecordState: full, hash or none (see RecordState).
	RecordState RecordState `env:"SYS1_RECORD_STATE" envDefault:"full"`
	// RetentionDays is the TTL of run records, labels, dead letters and aggregates.
	RetentionDays int `env:"SYS1_RETENTION_DAYS" envDefault:"90"`

	// BatchSize and BatchAge bound a batch: it is inserted when it holds BatchSize records or
	// its first record is BatchAge old, whichever comes first. ClickHouse wants few large
	// inserts (about one per second), not many small ones.
	BatchSize int           `env:"SYS1_SINK_BATCH_SIZE" envDefault:"5000"`
	BatchAge  time.Duration `env:"SYS1_SINK_BATCH_AGE" envDefault:"1s"`
	// AckWait of the sink consumer. While an insert is retried the sink keeps its messages
	// alive with InProgress every AckWait/3, so this only matters when the sink dies.
	AckWait time.Duration `env:"SYS1_SINK_ACK_WAIT" envDefault:"30s"`
	// MaxAckPending of the sink consumer, shared by every sink replica; at least BatchSize.
	MaxAckPending int `env:"SYS1_SINK_MAX_ACK_PENDING" envDefault:"20000"`
	// InsertTimeout bounds one insert attempt; a slow ClickHouse is retried like a down one.
	InsertTimeout time.Duration `env:"SYS1_SINK_INSERT_TIMEOUT" envDefault:"30s"`
	// RetryMin and RetryMax bound the exponential backoff between insert attempts.
	RetryMin time.Duration `env:"SYS1_SINK_RETRY_MIN" envDefault:"200ms"`
	RetryMax time.Duration `env:"SYS1_SINK_RETRY_MAX" envDefault:"30s"`
	// StatsInterval is how often the consumer lag is read and the counters are logged.
	StatsInterval time.Duration `env:"SYS1_SINK_STATS_INTERVAL" envDefault:"15s"`
	// ShutdownTimeout bounds the last flush when Run's context is cancelled; what cannot be
	// inserted in time is nak'ed for redelivery.
	ShutdownTimeout time.Duration `env:"SYS1_SINK_SHUTDOWN_TIMEOUT" envDefault:"10s"`
}

// DefaultConfig returns the defaults (what environment parsing yields with nothing set).
func DefaultConfig() Config {
	return Config{
		Database: "sys1", RecordState: RecordFull, RetentionDays: 90,
		BatchSize: 5000, BatchAge: time.Second, AckWait: 30 * time.Second, MaxAckPending: 20000,
		InsertTimeout: 30 * time.Second, RetryMin: 200 * time.Millisecond, RetryMax: 30 * time.Second,
		StatsInterval: 15 * time.Second, ShutdownTimeout: 10 * time.Second,
	}
}

var databaseName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate reports every bad variable, each error naming it.
func (c *Config) Validate() []error {
	var errs []error
	if c.DSN != "" {
		if _, err := ParseDSN(c.DSN); err != nil {
			errs = append(errs, fmt.Errorf("SYS1_CLICKHOUSE_DSN: %w", err))
		}
	}
	if !databaseName.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("SYS1_CLICKHOUSE_DATABASE: %q is not a plain identifier (letters, digits and _, not starting with a digit)", c.Database))
	}
	if !migrate.ValidCluster(c.Cluster) {
		errs = append(errs, fmt.Errorf("SYS1_CLICKHOUSE_CLUSTER: %q is not a ClickHouse cluster name (letters, digits, _ and -, starting with a letter or _, at most 63)", c.Cluster))
	}
	if !c.RecordState.Valid() {
		errs = append(errs, fmt.Errorf("SYS1_RECORD_STATE: %q is not one of full, hash, none", c.RecordState))
	}
	if c.RetentionDays < 1 || c.RetentionDays > 36500 {
		errs = append(errs, fmt.Errorf("SYS1_RETENTION_DAYS: must be 1–36500, got %d", c.RetentionDays))
	}
	if c.BatchSize < 1 || c.BatchSize > 1_000_000 {
		errs = append(errs, fmt.Errorf("SYS1_SINK_BATCH_SIZE: must be 1–1000000, got %d", c.BatchSize))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SYS1_SINK_BATCH_AGE", c.BatchAge}, {"SYS1_SINK_ACK_WAIT", c.AckWait},
		{"SYS1_SINK_INSERT_TIMEOUT", c.InsertTimeout}, {"SYS1_SINK_RETRY_MIN", c.RetryMin},
		{"SYS1_SINK_RETRY_MAX", c.RetryMax}, {"SYS1_SINK_STATS_INTERVAL", c.StatsInterval},
		{"SYS1_SINK_SHUTDOWN_TIMEOUT", c.ShutdownTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be a positive duration, got %s", d.name, d.v))
		}
	}
	if c.BatchAge > 0 && c.AckWait > 0 && c.BatchAge*2 > c.AckWait {
		errs = append(errs, fmt.Errorf("SYS1_SINK_BATCH_AGE: %s must be at most half of SYS1_SINK_ACK_WAIT %s, or records redeliver while their batch fills", c.BatchAge, c.AckWait))
	}
	if c.RetryMin > 0 && c.RetryMax > 0 && c.RetryMin > c.RetryMax {
		errs = append(errs, fmt.Errorf("SYS1_SINK_RETRY_MIN: %s exceeds SYS1_SINK_RETRY_MAX %s", c.RetryMin, c.RetryMax))
	}
	if c.MaxAckPending < c.BatchSize {
		errs = append(errs, fmt.Errorf("SYS1_SINK_MAX_ACK_PENDING: %d is below SYS1_SINK_BATCH_SIZE %d; batches could never fill", c.MaxAckPending, c.BatchSize))
	}
	return errs
}

func (c Config) validate() error {
	return errors.Join(c.Validate()...)
}

// ParseDSN parses a ClickHouse DSN: clickhouse:// or tcp:// select the native protocol,
// http:// and https:// the HTTP interface (https implies TLS). Settings, credentials and the
// default database are taken from the URL as clickhouse-go documents.
func ParseDSN(dsn string) (*clickhouse.Options, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, errors.New("not a URL (want clickhouse://host:9000 or http://host:8123)")
	}
	q := u.Query()
	switch u.Scheme {
	case "clickhouse", "tcp", "http":
	case "https":
		// clickhouse-go wants the TLS flag spelled out for https; https means TLS.
		if !q.Has("secure") {
			q.Set("secure", "true")
			u.RawQuery = q.Encode()
		}
	default:
		return nil, fmt.Errorf("scheme %q is not supported (want clickhouse://, tcp://, http:// or https://)", u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%s has no host", redact(u))
	}
	opts, err := clickhouse.ParseDSN(u.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", redact(u), err)
	}
	return opts, nil
}

// redact hides the password of a DSN so it can appear in errors and logs.
func redact(u *url.URL) string { return u.Redacted() }

// RedactDSN returns dsn with its password hidden, for logs.
func RedactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparseable DSN)"
	}
	return u.Redacted()
}

// Open connects to the ClickHouse of cfg.DSN and checks that it answers.
func Open(ctx context.Context, cfg Config) (driver.Conn, error) {
	if cfg.DSN == "" {
		return nil, errors.New("SYS1_CLICKHOUSE_DSN is not set")
	}
	opts, err := ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("SYS1_CLICKHOUSE_DSN: %w", err)
	}
	conn, err := openNoPing(opts)
	if err != nil {
		return nil, fmt.Errorf("open ClickHouse %s: %w", RedactDSN(cfg.DSN), err)
	}
	if err := conn.Ping(ctx); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("ClickHouse %s does not answer: %w", RedactDSN(cfg.DSN), err)
	}
	return conn, nil
}

// Migrate creates or upgrades the schema in cfg.Database and sets its TTL to
// cfg.RetentionDays (see package migrate, whose Migrate also reports what it did). Running it
// on an up-to-date schema is a no-op; a schema newer than this binary is an error.
func Migrate(ctx context.Context, conn driver.Conn, cfg Config) error {
	_, err := migrate.Migrate(ctx, conn, cfg.MigrateOptions())
	return err
}

// MigrateOptions are the schema parameters of cfg.
func (c Config) MigrateOptions() migrate.Options {
	return migrate.Options{Database: c.Database, RetentionDays: c.RetentionDays, Cluster: c.Cluster}
}

// openNoPing opens a connection pool without contacting the server (clickhouse-go dials
// lazily), with a bounded dial timeout so an unreachable server fails an attempt quickly.
func openNoPing(opts *clickhouse.Options) (driver.Conn, error) {
	if opts.DialTimeout == 0 || opts.DialTimeout > 10*time.Second {
		opts.DialTimeout = 10 * time.Second
	}
	return clickhouse.Open(opts)
}
