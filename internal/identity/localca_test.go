package identity_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// keyCert is a test certificate and its key.
type keyCert struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var serial int64

func caTemplate(name string, notBefore, notAfter time.Time) *x509.Certificate {
	serial++
	return &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
}

func validCA(name string) *x509.Certificate {
	return caTemplate(name, time.Now().Add(-time.Hour), time.Now().Add(48*time.Hour))
}

// issue signs tmpl with parent (self-signed when parent is nil).
func issue(t testing.TB, tmpl *x509.Certificate, parent *keyCert) *keyCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pc, pk := tmpl, key
	if parent != nil {
		pc, pk = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, pc, key.Public(), pk)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &keyCert{cert: c, key: key}
}

func certsPEM(certs ...*keyCert) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})...)
	}
	return out
}

func keyPEM(t testing.TB, k *ecdsa.PrivateKey, kind string) []byte {
	t.Helper()
	var der []byte
	var err error
	switch kind {
	case "PRIVATE KEY":
		der, err = x509.MarshalPKCS8PrivateKey(k)
	case "EC PRIVATE KEY":
		der, err = x509.MarshalECPrivateKey(k)
	}
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func writeDir(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if data == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// signFor makes a CSR for id and has ca sign it.
func signFor(t testing.TB, ca identity.CA, id identity.Identity, ttl time.Duration) (*ecdsa.PrivateKey, []*x509.Certificate, []*x509.Certificate) {
	t.Helper()
	csr, key, err := identity.GenerateCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	chain, roots, err := ca.Sign(context.Background(), csr, id, ttl)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return key, chain, roots
}

func TestLocalCAEphemeral(t *testing.T) {
	ca, err := identity.NewLocalCA("example.org")
	if err != nil {
		t.Fatal(err)
	}
	id := identity.New("example.org", "ns1", "sa1")
	before := time.Now().Truncate(time.Second)
	key, chain, roots := signFor(t, ca, id, time.Hour)
	if len(chain) != 1 || len(roots) != 1 {
		t.Fatalf("chain %d roots %d, want 1 and 1 (root signs directly)", len(chain), len(roots))
	}
	if got := roots[0].Subject.Organization; len(got) != 1 || got[0] != "example.org" {
		t.Fatalf("root subject O = %v", got)
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		t.Fatalf("leaf URIs = %v", leaf.URIs)
	}
	if leaf.IsCA {
		t.Fatal("leaf is a CA")
	}
	if got := leaf.ExtKeyUsage; len(got) != 2 || got[0] != x509.ExtKeyUsageServerAuth || got[1] != x509.ExtKeyUsageClientAuth {
		t.Fatalf("ExtKeyUsage = %v", got)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life != time.Hour {
		t.Fatalf("validity %s, want 1h", life)
	}
	if leaf.NotBefore.Before(before) {
		t.Fatalf("NotBefore %s is before the request (%s)", leaf.NotBefore, before)
	}
	if _, err := identity.NewCertificate(id, key, chain, roots, time.Now()); err != nil {
		t.Fatalf("NewCertificate: %v", err)
	}
	if string(ca.RootsPEM()) != string(certsPEM(&keyCert{cert: roots[0]})) {
		t.Fatal("RootsPEM does not match Roots")
	}
}

func TestLocalCASignRejects(t *testing.T) {
	ca, err := identity.NewLocalCA("")
	if err != nil {
		t.Fatal(err)
	}
	id := identity.New("", "a", "b")
	other := identity.New("", "a", "other")
	csrOther, _, err := identity.GenerateCSR(other)
	if err != nil {
		t.Fatal(err)
	}
	csr, _, err := identity.GenerateCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	tampered := []byte(strings.Replace(string(csr), string(csr[40:44]), "AAAA", 1))
	for _, tc := range []struct {
		name string
		csr  []byte
		ttl  time.Duration
		want string
	}{
		{name: "not PEM", csr: []byte("garbage"), want: "CSR is not PEM"},
		{name: "wrong block", csr: certsPEM(&keyCert{cert: ca.Roots()[0]}), want: `CSR PEM block is "CERTIFICATE"`},
		{name: "CSR for another identity", csr: csrOther, want: "CSR asks for spiffe://cluster.local/ns/a/sa/other: identity mismatch"},
		{name: "negative ttl", csr: csr, ttl: -time.Second, want: "negative ttl"},
		{name: "tampered", csr: tampered, want: "CSR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ca.Sign(context.Background(), tc.csr, id, tc.ttl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Sign error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLocalCATTLCappedAtCAExpiry(t *testing.T) {
	root := issue(t, validCA("root"), nil)
	short := caTemplate("short", time.Now().Add(-time.Hour), time.Now().Add(30*time.Minute))
	inter := issue(t, short, root)
	dir := writeDir(t, map[string][]byte{
		identity.CACertFile: certsPEM(inter), identity.CAKeyFile: keyPEM(t, inter.key, "PRIVATE KEY"),
		identity.RootCertFile: certsPEM(root),
	})
	ca, err := identity.LoadLocalCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, chain, _ := signFor(t, ca, identity.New("", "a", "b"), 0)
	if !chain[0].NotAfter.Equal(inter.cert.NotAfter) {
		t.Fatalf("leaf NotAfter %s, want capped at CA NotAfter %s", chain[0].NotAfter, inter.cert.NotAfter)
	}
}

func TestLoadLocalCA(t *testing.T) {
	root := issue(t, validCA("root"), nil)
	inter := issue(t, validCA("intermediate"), root)
	for _, tc := range []struct {
		name      string
		files     map[string][]byte
		wantChain []*keyCert // after the leaf
	}{
		{
			name: "intermediate with cert-chain",
			files: map[string][]byte{
				identity.CACertFile: certsPEM(inter), identity.CAKeyFile: keyPEM(t, inter.key, "PRIVATE KEY"),
				identity.RootCertFile: certsPEM(root), identity.CertChainFile: certsPEM(inter, root),
			},
			wantChain: []*keyCert{inter, root},
		},
		{
			name: "intermediate without cert-chain, SEC1 key",
			files: map[string][]byte{
				identity.CACertFile: certsPEM(inter), identity.CAKeyFile: keyPEM(t, inter.key, "EC PRIVATE KEY"),
				identity.RootCertFile: certsPEM(root),
			},
			wantChain: []*keyCert{inter},
		},
		{
			name: "root signs directly",
			files: map[string][]byte{
				identity.CACertFile: certsPEM(root), identity.CAKeyFile: keyPEM(t, root.key, "PRIVATE KEY"),
				identity.RootCertFile: certsPEM(root),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, err := identity.LoadLocalCA(writeDir(t, tc.files))
			if err != nil {
				t.Fatal(err)
			}
			id := identity.New("", "ns", "sa")
			key, chain, roots := signFor(t, ca, id, time.Hour)
			if len(chain) != 1+len(tc.wantChain) {
				t.Fatalf("chain has %d certificates, want %d", len(chain), 1+len(tc.wantChain))
			}
			for i, want := range tc.wantChain {
				if !chain[1+i].Equal(want.cert) {
					t.Fatalf("chain[%d] = %s, want %s", 1+i, chain[1+i].Subject, want.cert.Subject)
				}
			}
			if len(roots) != 1 || !roots[0].Equal(root.cert) {
				t.Fatalf("roots = %v", roots)
			}
			if _, err := identity.NewCertificate(id, key, chain, roots, time.Now()); err != nil {
				t.Fatalf("issued chain does not verify: %v", err)
			}
		})
	}
}

func TestLoadLocalCAErrors(t *testing.T) {
	root := issue(t, validCA("root"), nil)
	inter := issue(t, validCA("intermediate"), root)
	otherRoot := issue(t, validCA("other root"), nil)
	leafTmpl := validCA("leaf")
	leafTmpl.IsCA, leafTmpl.KeyUsage = false, x509.KeyUsageDigitalSignature
	leaf := issue(t, leafTmpl, root)
	noSignTmpl := validCA("no keyCertSign")
	noSignTmpl.KeyUsage = x509.KeyUsageDigitalSignature
	noSign := issue(t, noSignTmpl, root)
	expired := issue(t, caTemplate("expired", time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)), root)
	good := func() map[string][]byte {
		return map[string][]byte{
			identity.CACertFile: certsPEM(inter), identity.CAKeyFile: keyPEM(t, inter.key, "PRIVATE KEY"),
			identity.RootCertFile: certsPEM(root), identity.CertChainFile: certsPEM(inter, root),
		}
	}
	with := func(changes map[string][]byte, remove ...string) map[string][]byte {
		f := good()
		for k, v := range changes {
			f[k] = v
		}
		for _, k := range remove {
			delete(f, k)
		}
		return f
	}
	for _, tc := range []struct {
		name   string
		files  map[string][]byte
		file   string // the file the error names
		want   string // the error after "identity: load local CA <file>: "
		wantIs error
	}{
		{name: "missing ca-cert", files: with(nil, identity.CACertFile), file: identity.CACertFile,
			want: "open {file}: no such file or directory", wantIs: os.ErrNotExist},
		{name: "missing ca-key", files: with(nil, identity.CAKeyFile), file: identity.CAKeyFile,
			want: "open {file}: no such file or directory", wantIs: os.ErrNotExist},
		{name: "missing root-cert", files: with(nil, identity.RootCertFile), file: identity.RootCertFile,
			want: "open {file}: no such file or directory", wantIs: os.ErrNotExist},
		{name: "ca-cert not PEM", files: with(map[string][]byte{identity.CACertFile: []byte("hello")}), file: identity.CACertFile,
			want: "no PEM certificate found"},
		{name: "ca-cert holds a key", files: with(map[string][]byte{identity.CACertFile: keyPEM(t, inter.key, "PRIVATE KEY")}),
			file: identity.CACertFile, want: `unexpected PEM block "PRIVATE KEY", want "CERTIFICATE"`},
		{name: "ca-cert holds two certificates", files: with(map[string][]byte{identity.CACertFile: certsPEM(inter, root)}),
			file: identity.CACertFile, want: "holds 2 certificates, want 1"},
		{name: "ca-key not PEM", files: with(map[string][]byte{identity.CAKeyFile: []byte("secret")}), file: identity.CAKeyFile,
			want: "no PEM private key found"},
		{name: "ca-key holds a certificate", files: with(map[string][]byte{identity.CAKeyFile: certsPEM(inter)}), file: identity.CAKeyFile,
			want: `unsupported private key: PEM block "CERTIFICATE"`, wantIs: identity.ErrCAUnsupportedKey},
		{name: "key does not match cert", files: with(map[string][]byte{identity.CAKeyFile: keyPEM(t, root.key, "PRIVATE KEY")}),
			file: identity.CAKeyFile, want: "private key does not match ca-cert.pem", wantIs: identity.ErrCAKeyMismatch},
		{name: "cert is not a CA", files: with(map[string][]byte{
			identity.CACertFile: certsPEM(leaf), identity.CAKeyFile: keyPEM(t, leaf.key, "PRIVATE KEY"), identity.CertChainFile: nil,
		}, identity.CertChainFile), file: identity.CACertFile,
			want: identity.ErrCANotCA.Error(), wantIs: identity.ErrCANotCA},
		{name: "CA without keyCertSign", files: with(map[string][]byte{
			identity.CACertFile: certsPEM(noSign), identity.CAKeyFile: keyPEM(t, noSign.key, "PRIVATE KEY"),
		}, identity.CertChainFile), file: identity.CACertFile,
			want: identity.ErrCANotCA.Error(), wantIs: identity.ErrCANotCA},
		{name: "expired CA", files: with(map[string][]byte{
			identity.CACertFile: certsPEM(expired), identity.CAKeyFile: keyPEM(t, expired.key, "PRIVATE KEY"),
		}, identity.CertChainFile), file: identity.CACertFile,
			want: "certificate is outside its validity period: valid " +
				expired.cert.NotBefore.UTC().Format(time.RFC3339) + " to " + expired.cert.NotAfter.UTC().Format(time.RFC3339),
			wantIs: identity.ErrCAExpired},
		{name: "ca-cert not signed by root", files: with(map[string][]byte{
			identity.RootCertFile: certsPEM(otherRoot), identity.CertChainFile: certsPEM(inter),
		}), file: identity.CACertFile,
			want: "ca-cert.pem does not verify against root-cert.pem: x509: certificate signed by unknown authority", wantIs: identity.ErrCAUntrusted},
		{name: "cert-chain does not start with ca-cert", files: with(map[string][]byte{identity.CertChainFile: certsPEM(root)}),
			file: identity.CertChainFile, want: "first certificate is not ca-cert.pem", wantIs: identity.ErrCAChainMismatch},
		{name: "cert-chain empty", files: with(map[string][]byte{identity.CertChainFile: {}}),
			file: identity.CertChainFile, want: "no PEM certificate found"},
		{name: "root-cert garbage", files: with(map[string][]byte{identity.RootCertFile: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")}),
			file: identity.RootCertFile, want: "certificate 1: x509: malformed certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeDir(t, tc.files)
			_, err := identity.LoadLocalCA(dir)
			if err == nil {
				t.Fatal("LoadLocalCA succeeded")
			}
			path := filepath.Join(dir, tc.file)
			want := "identity: load local CA " + path + ": " + strings.ReplaceAll(tc.want, "{file}", path)
			if err.Error() != want {
				t.Fatalf("error\n got: %s\nwant: %s", err, want)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Fatalf("errors.Is(%v, %v) = false", err, tc.wantIs)
			}
		})
	}
}

func FuzzLocalCASign(f *testing.F) {
	ca, err := identity.NewLocalCA("")
	if err != nil {
		f.Fatal(err)
	}
	id := identity.New("", "a", "b")
	csr, _, err := identity.GenerateCSR(id)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(csr)
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		chain, _, err := ca.Sign(context.Background(), data, id, time.Minute)
		if err == nil && (len(chain) != 1 || chain[0].URIs[0].String() != id.String()) {
			t.Fatalf("signed an unexpected chain: %v", chain)
		}
	})
}

func bigInt(n int64) *big.Int { return big.NewInt(n) }
