package xds

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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

	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// testPKI is a CA and a server certificate it signed.
type testPKI struct {
	caPEM   []byte
	srvCert tls.Certificate
}

// newTestPKI issues a server certificate valid for the given DNS names and
// 127.0.0.1.
func newTestPKI(t *testing.T, dnsNames ...string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "xds test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "istiod"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		DNSNames:     dnsNames,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testPKI{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		srvCert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t, "istiod.istio-system.svc")
	other := newTestPKI(t, "istiod.istio-system.svc")
	caFile := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(caFile, pki.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name      string
		host      string // replaces 127.0.0.1 in the address
		configure func(*Options)
		wantReady bool
	}{
		{name: "inline root", configure: func(o *Options) { o.RootCAPEM = pki.caPEM }, wantReady: true},
		{name: "root file", configure: func(o *Options) { o.RootCAFile = caFile }, wantReady: true},
		{name: "untrusted root", configure: func(o *Options) { o.RootCAPEM = other.caPEM }},
		{name: "missing root file", configure: func(o *Options) { o.RootCAFile = filepath.Join(t.TempDir(), "absent.pem") }},
		{
			name: "name only in AltHostname",
			host: "localhost",
			configure: func(o *Options) {
				o.RootCAPEM = pki.caPEM
				o.AltHostname = "istiod.istio-system.svc"
			},
			wantReady: true,
		},
		{name: "name not in certificate", host: "localhost", configure: func(o *Options) { o.RootCAPEM = pki.caPEM }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			srv := xdstest.NewServer(t, xdstest.Options{TLS: &tls.Config{Certificates: []tls.Certificate{pki.srvCert}}})
			attempts := make(chan struct{}, 1)
			c := startClient(t, srv, newFakeHandler(), func(o *Options) {
				if tt.host != "" {
					o.Address = strings.Replace(o.Address, "127.0.0.1", tt.host, 1)
				}
				// The token callback marks each connection attempt.
				o.Token = func() (string, error) {
					select {
					case attempts <- struct{}{}:
					default:
					}
					return "t", nil
				}
				tt.configure(o)
			})
			if tt.wantReady {
				c.waitReady(t)
				return
			}
			for range 3 {
				select {
				case <-attempts:
				case <-time.After(testTimeout):
					t.Fatal("client stopped retrying")
				}
			}
			if c.isReady() {
				t.Fatal("ready over a connection that should not verify")
			}
			if n := srv.RequestCount(); n != 0 {
				t.Fatalf("server received %d requests over an unverified connection", n)
			}
		})
	}
}
