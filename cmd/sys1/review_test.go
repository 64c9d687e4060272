package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/cmd/sys1/review"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

func writeReviewers(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reviewers")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReviewCommandConfigErrors: every bad setting is named in one start-up error.
func TestReviewCommandConfigErrors(t *testing.T) {
	good, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	t.Run("unset users", func(t *testing.T) {
		var errOut bytes.Buffer
		if code := run(context.Background(), []string{"review"}, &bytes.Buffer{}, &errOut); code != exitUsage {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
		if !strings.Contains(errOut.String(), "SYS1_REVIEW_USERS is not set") {
			t.Errorf("stderr: %s", errOut.String())
		}
	})
	t.Run("every bad variable", func(t *testing.T) {
		t.Setenv("SYS1_REVIEW_USERS", writeReviewers(t, "alice:"+string(good)+"\nbob:$apr1$xyz$abcdefghijklmnopqrstuv\n"))
		t.Setenv("SYS1_REVIEW_TLS_CERT", "/nonexistent/cert.pem")
		t.Setenv("SYS1_REVIEW_SESSION_TTL", "5s")
		t.Setenv("SYS1_REVIEW_STATE_LIMIT", "10")
		t.Setenv("SYS1_REVIEW_SESSIONS_BUCKET", "bad.name")
		var errOut bytes.Buffer
		if code := run(context.Background(), []string{"review", "--http", "0.0.0.0:8090"}, &bytes.Buffer{}, &errOut); code != exitUsage {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
		for _, want := range []string{
			`SYS1_REVIEW_USERS: ` /* the file */, `line 2 (user "bob"): the password hash is Apache MD5 ($apr1$)`,
			"SYS1_REVIEW_TLS_CERT and SYS1_REVIEW_TLS_KEY: set both or neither",
			"SYS1_REVIEW_SESSION_TTL: must be between 1m and 720h", "SYS1_REVIEW_STATE_LIMIT: must be between 1024",
			"SYS1_REVIEW_SESSIONS_BUCKET", "--http: 0.0.0.0:8090 listens on 0.0.0.0 without TLS",
		} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
			}
		}
		if strings.Contains(errOut.String(), "abcdefghijklmnopqrstuv") {
			t.Errorf("the error quotes a hash:\n%s", errOut.String())
		}
	})
	t.Run("a certificate that does not load", func(t *testing.T) {
		t.Setenv("SYS1_REVIEW_USERS", writeReviewers(t, "alice:"+string(good)+"\n"))
		t.Setenv("SYS1_REVIEW_TLS_CERT", writeReviewers(t, "not a certificate"))
		t.Setenv("SYS1_REVIEW_TLS_KEY", writeReviewers(t, "not a key"))
		var errOut bytes.Buffer
		if code := run(context.Background(), []string{"review", "--http", "0.0.0.0:8443"}, &bytes.Buffer{}, &errOut); code != exitUsage {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(errOut.String(), "SYS1_REVIEW_TLS_CERT: cannot load the certificate and key") || strings.Contains(errOut.String(), "--http") {
			t.Errorf("stderr:\n%s", errOut.String())
		}
	})
}

// TestReviewCommandHashPassword: --hash-password prints a line the page accepts, at the
// recommended cost, and refuses a short password.
func TestReviewCommandHashPassword(t *testing.T) {
	stdin = strings.NewReader("correct horse battery\n")
	t.Cleanup(func() { stdin = os.Stdin })
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"review", "--hash-password", "alice"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	// That the hash verifies is review.HashPassword's test (at a low cost: bcrypt at cost 12
	// takes many seconds per hash under the race detector); here: the line's shape and cost.
	line := strings.TrimSpace(out.String())
	if _, err := review.ParseUsers([]byte(line)); err != nil || !strings.HasPrefix(line, "alice:$2a$") {
		t.Fatalf("%q is not an htpasswd line the page accepts: %v", line, err)
	}
	if cost, _ := bcrypt.Cost([]byte(strings.TrimPrefix(line, "alice:"))); cost != review.RecommendedCost {
		t.Errorf("cost %d, want %d", cost, review.RecommendedCost)
	}
	stdin = strings.NewReader("short\n")
	if code := run(context.Background(), []string{"review", "--hash-password", "alice"}, &bytes.Buffer{}, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "at least 8 characters") {
		t.Errorf("short password: %d %s", code, errOut.String())
	}
}

// TestReviewCommandServes runs `sys1 review` against a real nats-server: it serves the login
// page with its security headers, reports ready once it has read the stream, and exits 0 on
// SIGTERM.
func TestReviewCommandServes(t *testing.T) {
	srv := natstest.Start(t)
	good, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_REVIEW_USERS", writeReviewers(t, "alice:"+string(good)+"\n"))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr natstest.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"review", "--http", addr}, &bytes.Buffer{}, &stderr) }()
	natstest.WaitFor(t, 30*time.Second, "the review page to be ready", func() bool {
		res, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	res, err := http.Get("http://" + addr + "/login")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(res.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("/login: %d %v", res.StatusCode, res.Header)
	}
	if !strings.Contains(stderr.String(), `"review page serving"`) || !strings.Contains(stderr.String(), `"weak password hash`) {
		t.Errorf("start-up logs:\n%s", stderr.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sys1 review did not stop")
	}
}
