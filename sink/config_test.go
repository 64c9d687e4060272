package sink

import (
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/caarlos0/env/v11"
)

func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn      string
		protocol clickhouse.Protocol
		tls      bool
		database string
		host     string
	}{
		{"clickhouse://ch.internal:9000/analytics", clickhouse.Native, false, "analytics", "ch.internal:9000"},
		{"tcp://127.0.0.1:9000", clickhouse.Native, false, "", "127.0.0.1:9000"},
		{"clickhouse://u:p@ch:9440/sys1?secure=true", clickhouse.Native, true, "sys1", "ch:9440"},
		{"http://127.0.0.1:8123", clickhouse.HTTP, false, "", "127.0.0.1:8123"},
		{"http://u:p@ch:8123/sys1?dial_timeout=2s", clickhouse.HTTP, false, "sys1", "ch:8123"},
		{"https://ch.example.com:8443", clickhouse.HTTP, true, "", "ch.example.com:8443"},
	} {
		t.Run(tc.dsn, func(t *testing.T) {
			o, err := ParseDSN(tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			if o.Protocol != tc.protocol || (o.TLS != nil) != tc.tls || o.Auth.Database != tc.database || len(o.Addr) != 1 || o.Addr[0] != tc.host {
				t.Fatalf("ParseDSN(%q) = protocol %v, tls %v, db %q, addr %v", tc.dsn, o.Protocol, o.TLS != nil, o.Auth.Database, o.Addr)
			}
		})
	}
	for _, bad := range []string{"ftp://x:21", "localhost:9000", "http://", "://nope", "http://u:hunter2@h:8123?secure=true"} {
		t.Run("bad "+bad, func(t *testing.T) {
			_, err := ParseDSN(bad)
			if err == nil {
				t.Fatalf("ParseDSN(%q) accepted it", bad)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestConfigFromEnvAndValidate(t *testing.T) {
	var cfg Config
	if err := env.Parse(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg != DefaultConfig() {
		t.Fatalf("env defaults %+v differ from DefaultConfig %+v", cfg, DefaultConfig())
	}
	if errs := cfg.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	bad := DefaultConfig()
	bad.DSN, bad.Database, bad.RecordState, bad.RetentionDays = "mysql://x", "sys1-prod", "partial", 0
	bad.BatchSize, bad.BatchAge, bad.AckWait, bad.MaxAckPending = 50_000, 40*time.Second, 30*time.Second, 10
	bad.RetryMin, bad.RetryMax = time.Minute, time.Second
	var got []string
	for _, e := range bad.Validate() {
		got = append(got, e.Error())
	}
	joined := strings.Join(got, "\n")
	for _, v := range []string{"SYS1_CLICKHOUSE_DSN", "SYS1_CLICKHOUSE_DATABASE", "SYS1_RECORD_STATE", "SYS1_RETENTION_DAYS",
		"SYS1_SINK_BATCH_AGE", "SYS1_SINK_MAX_ACK_PENDING", "SYS1_SINK_RETRY_MIN"} {
		if !strings.Contains(joined, v+":") {
			t.Errorf("no error names %s; got:\n%s", v, joined)
		}
	}
}
