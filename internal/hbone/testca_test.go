package hbone

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"testing"
	"time"
)

// testCA is a tiny SPIFFE CA for tests: a self-signed root and leaves with
// spiffe://cluster.local/ns/<ns>/sa/<sa> URI SANs.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{"hbone test CA"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func spiffeID(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

// leaf issues a certificate for ns/sa, usable as client and server.
func (ca *testCA) leaf(t testing.TB, ns, sa string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(spiffeID(ns, sa))
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}
}

// verifier checks the peer chain against the CA and its URI SAN against
// allowed (any SPIFFE id if allowed is empty), as Istio does.
func (ca *testCA) verifier(allowed ...string) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no peer certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return err
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{
			Roots:         ca.pool,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		}); err != nil {
			return err
		}
		if len(certs[0].URIs) != 1 {
			return errors.New("want exactly one URI SAN")
		}
		id := certs[0].URIs[0].String()
		if len(allowed) > 0 && !slices.Contains(allowed, id) {
			return fmt.Errorf("peer %s not in %v", id, allowed)
		}
		return nil
	}
}

func (ca *testCA) serverConfig(t testing.TB, ns, sa string, allowedClients ...string) *tls.Config {
	return &tls.Config{
		Certificates:          []tls.Certificate{ca.leaf(t, ns, sa)},
		ClientAuth:            tls.RequireAnyClientCert,
		VerifyPeerCertificate: ca.verifier(allowedClients...),
		MinVersion:            tls.VersionTLS13,
		NextProtos:            []string{"h2"},
	}
}

// clientConfig presents ns/sa and accepts only a server presenting one of
// expectServer. Verification is done by VerifyPeerCertificate (SPIFFE has
// no DNS names), hence InsecureSkipVerify.
func (ca *testCA) clientConfig(t testing.TB, ns, sa string, expectServer ...string) *tls.Config {
	cfg := &tls.Config{
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: ca.verifier(expectServer...),
		MinVersion:            tls.VersionTLS13,
		NextProtos:            []string{"h2"},
	}
	if ns != "" {
		cfg.Certificates = []tls.Certificate{ca.leaf(t, ns, sa)}
	}
	return cfg
}
