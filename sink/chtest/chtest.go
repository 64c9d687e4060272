// Package chtest gives tests a real ClickHouse: the server named by SYS1_TEST_CLICKHOUSE_DSN
// (chshim in CI, or any ClickHouse server) and a fresh database per test, dropped at cleanup.
//
// Without the variable tests skip, naming it; with SYS1_TEST_REQUIRE_CLICKHOUSE=1 (CI) they
// fail instead, so a CI run can never pass by skipping the ClickHouse suite.
package chtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// DSNVar and RequireVar are the environment variables the harness reads.
const (
	DSNVar     = "SYS1_TEST_CLICKHOUSE_DSN"
	RequireVar = "SYS1_TEST_REQUIRE_CLICKHOUSE"
)

// DSN returns the test server's DSN or skips (fails under RequireVar=1) when there is none.
func DSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(DSNVar)
	if dsn == "" {
		if os.Getenv(RequireVar) == "1" {
			tb.Fatalf("%s is not set but %s=1: a ClickHouse server is required (start one with ../shared/tools/chshim/start.sh)", DSNVar, RequireVar)
		}
		tb.Skipf("ClickHouse tests need %s (e.g. DSN=$(../shared/tools/chshim/start.sh 18124)); skipping", DSNVar)
	}
	return dsn
}

// DB is one test's database on the test server.
type DB struct {
	DSN  string      // the server DSN
	Name string      // the database name, sys1_test_<random>
	Conn driver.Conn // a connection to the server (not bound to Name; qualify table names)
}

// New opens the test server and names a fresh database, dropped when the test ends. The
// database itself is not created: that is the job of the code under test (migrations).
func New(tb testing.TB) *DB {
	tb.Helper()
	dsn := DSN(tb)
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("%s: %v", DSNVar, err)
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		tb.Fatalf("open ClickHouse at %s: %v", DSNVar, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		tb.Fatalf("ClickHouse at %s does not answer: %v", DSNVar, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := &DB{DSN: dsn, Name: "sys1_test_" + hex.EncodeToString(b[:]), Conn: conn}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+db.Name+"`"); err != nil {
			tb.Errorf("drop test database %s: %v", db.Name, err)
		}
		_ = conn.Close()
	})
	return db
}

// Count runs a query returning one unsigned integer.
func (d *DB) Count(tb testing.TB, query string, args ...any) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var n uint64
	if err := d.Conn.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}
