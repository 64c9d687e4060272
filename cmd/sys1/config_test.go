package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryCommandNamesEveryBadVariable: each command given several bad variables at once
// (values that do not parse, values out of range, settings that contradict each other, a
// missing required variable) stops with one message that names each of them at the start of
// its own line, and names no variable that is not at fault.
func TestEveryCommandNamesEveryBadVariable(t *testing.T) {
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string // variables (or flags) each on its own line
		not  []string // variables that are not at fault
	}{
		{"worker", []string{"worker"}, map[string]string{
			"SYS1_CONCURRENCY": "x", "SYS1_SHUTDOWN_GRACE": "soon", "SYS1_ACK_WAIT": "5",
			"SYS1_NATS_MAX_PAYLOAD": "big", "SYS1_RETRY_BASE": "2m", "SYS1_RETRY_MAX": "1m",
			"SYS1_TIMEOUT_MS": "abc", "SYS1_CLICKHOUSE_DSN": "ftp://x", "SYS1_SINK_BATCH_SIZE": "q",
			"SYS1_AUTH_MODE": "jwt", "SYS1_JWT_JWKS_FILE": "/nonexistent/jwks.json", "SYS1_JWT_HS256_SECRET": "short",
			"SYS1_NATS_TLS_KEY": "/nonexistent/key.pem",
		}, []string{
			"SYS1_CONCURRENCY", "SYS1_SHUTDOWN_GRACE", "SYS1_ACK_WAIT", "SYS1_NATS_MAX_PAYLOAD", "SYS1_RETRY_MAX",
			"SYS1_TIMEOUT_MS", "SYS1_CLICKHOUSE_DSN", "SYS1_SINK_BATCH_SIZE", "SYS1_JWT_JWKS_FILE",
			"SYS1_JWT_HS256_SECRET", "SYS1_JWT_ISSUER", "SYS1_JWT_AUDIENCE", "SYS1_NATS_TLS_CERT",
		}, []string{"SYS1_JWT_JWKS_URL", "SYS1_RETRY_BASE"}},
		{"sink", []string{"sink"}, map[string]string{
			"SYS1_CLICKHOUSE_DSN": "", "SYS1_SINK_BATCH_AGE": "x", "SYS1_RETENTION_DAYS": "ninety",
			"SYS1_NATS_URL": "http://x", "SYS1_LOG_LEVEL": "loud", "SYS1_HTTP_ADDR": "8080",
			"SYS1_SINK_RETRY_MIN": "1m", "SYS1_SINK_RETRY_MAX": "1s",
		}, []string{
			"SYS1_CLICKHOUSE_DSN", "SYS1_SINK_BATCH_AGE", "SYS1_RETENTION_DAYS", "SYS1_NATS_URL",
			"SYS1_LOG_LEVEL", "SYS1_HTTP_ADDR", "SYS1_SINK_RETRY_MIN",
		}, nil},
		{"migrate", []string{"migrate", "-wait", "0"}, map[string]string{
			"SYS1_CLICKHOUSE_DSN": "", "SYS1_RETENTION_DAYS": "ninety", "SYS1_LOG_LEVEL": "loud",
			"SYS1_CLICKHOUSE_DATABASE": "no-dashes",
		}, []string{"SYS1_CLICKHOUSE_DSN", "SYS1_RETENTION_DAYS", "SYS1_LOG_LEVEL", "SYS1_CLICKHOUSE_DATABASE", "-wait"}, nil},
		{"decide", []string{"decide", ticket}, map[string]string{
			"SYS1_NATS_URL": "http://x", "SYS1_NATS_MAX_PAYLOAD": "big", "SYS1_NATS_USER": "u", "SYS1_NATS_TOKEN": "tok",
		}, []string{"SYS1_NATS_URL", "SYS1_NATS_MAX_PAYLOAD", "SYS1_NATS_USER", "SYS1_NATS_PASSWORD"}, []string{"SYS1_NATS_CREDS"}},
		{"bench", []string{"bench"}, map[string]string{
			"SYS1_NATS_URL": "http://x", "SYS1_NATS_MAX_PAYLOAD": "big", "SYS1_NATS_TLS_CERT": "/nonexistent/cert.pem",
		}, []string{"SYS1_NATS_URL", "SYS1_NATS_MAX_PAYLOAD", "SYS1_NATS_TLS_CERT", "SYS1_NATS_TLS_KEY"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errOut); code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitUsage, errOut.String())
			}
			msg := errOut.String()
			if !strings.HasPrefix(msg, "sys1 "+tc.name+": invalid configuration:\n") {
				t.Errorf("not one configuration error:\n%s", msg)
			}
			for _, v := range tc.want {
				if !strings.Contains(msg, "\n  - "+v+":") && !strings.Contains(msg, "\n  - "+v+" ") {
					t.Errorf("no line names %s:\n%s", v, msg)
				}
			}
			for _, v := range tc.not {
				if strings.Contains(msg, "\n  - "+v) {
					t.Errorf("a line blames %s, which is not at fault:\n%s", v, msg)
				}
			}
		})
	}
}
