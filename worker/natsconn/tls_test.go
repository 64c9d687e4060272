package natsconn

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client certificate as PEM files.
type testPKI struct{ dir, caFile, serverCert, serverKey, clientCert, clientKey string }

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	p := testPKI{dir: dir}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sys1 test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.caFile = writePEM(t, dir, "ca.crt", "CERTIFICATE", caDER)

	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
		return writePEM(t, dir, name+".crt", "CERTIFICATE", der), writePEM(t, dir, name+".key", "PRIVATE KEY", keyDER)
	}
	p.serverCert, p.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConnectMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	tlsCfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.serverCert, KeyFile: pki.serverKey, CaFile: pki.caFile, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &server.Options{TLS: true, TLSVerify: true, TLSConfig: tlsCfg, TLSTimeout: 5})

	cfg := DefaultConfig()
	cfg.URL = "tls://" + s.Addr().String()
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = pki.caFile, pki.clientCert, pki.clientKey
	var logs natstest.Buffer
	c, err := Connect(context.Background(), cfg, "tls-test", zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NC.TLSConnectionState(); err != nil {
		t.Fatalf("not a TLS connection: %v", err)
	}
	roundTrip(t, c, "TLS")
	c.Close()

	// A server whose certificate does not chain to the configured CA is refused at once,
	// not retried forever.
	other := newTestPKI(t)
	cfg.TLSCA = other.caFile
	start := time.Now()
	_, err = Connect(context.Background(), cfg, "tls-test", zerolog.New(&logs))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("want a certificate verification error, got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("an untrusted server certificate must fail at once")
	}
}
