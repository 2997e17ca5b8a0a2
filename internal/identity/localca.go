package identity

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// File names of an Istio plugged-in CA ("cacerts" secret), with Istio's
// meaning: CACertFile/CAKeyFile sign workload certificates, RootCertFile is
// the trust bundle, and the optional CertChainFile is the chain from
// CACertFile up to the root (Istio's samples hold ca-cert then root).
const (
	CACertFile    = "ca-cert.pem"
	CAKeyFile     = "ca-key.pem"
	RootCertFile  = "root-cert.pem"
	CertChainFile = "cert-chain.pem"
)

// DefaultCertTTL is the workload certificate lifetime when none is asked
// for: upstream's SECRET_TTL default.
const DefaultCertTTL = 24 * time.Hour

// ephemeralRootTTL is the lifetime of the root LocalCA generates: one process
// lifetime is all it must cover, a year keeps it clear of any workload TTL.
const ephemeralRootTTL = 365 * 24 * time.Hour

// Reasons a plug-in CA directory is rejected (see LoadLocalCA).
var (
	ErrCANotCA          = errors.New("certificate is not a CA (basicConstraints CA:TRUE with keyCertSign required)")
	ErrCAKeyMismatch    = errors.New("private key does not match ca-cert.pem")
	ErrCAChainMismatch  = errors.New("first certificate is not ca-cert.pem")
	ErrCAUntrusted      = errors.New("ca-cert.pem does not verify against root-cert.pem")
	ErrCAExpired        = errors.New("certificate is outside its validity period")
	ErrCAUnsupportedKey = errors.New("unsupported private key")
)

// LocalCA is the in-process CA behind FAKE_CA=true: either an ephemeral
// self-signed root (NewLocalCA) or an Istio plug-in CA directory
// (LoadLocalCA). It is safe for concurrent use.
type LocalCA struct {
	// immutable after construction
	signer crypto.Signer
	cert   *x509.Certificate   // signs leaves
	chain  []*x509.Certificate // sent after the leaf: ca-cert up towards the root
	roots  []*x509.Certificate
}

var _ CA = (*LocalCA)(nil)

// NewLocalCA returns a CA with a fresh self-signed ECDSA P-256 root whose
// subject is O=<trustDomain> (Istio's self-signed root names it so).
func NewLocalCA(trustDomain string) (*LocalCA, error) {
	if trustDomain == "" {
		trustDomain = DefaultTrustDomain
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: new local CA: key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("identity: new local CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{trustDomain}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(ephemeralRootTTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("identity: new local CA: self-sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("identity: new local CA: %w", err)
	}
	return &LocalCA{signer: key, cert: cert, roots: []*x509.Certificate{cert}}, nil
}

// LoadLocalCA reads an Istio plug-in CA directory (see CACertFile and
// friends). It checks that the key matches ca-cert.pem, that ca-cert.pem is
// a currently valid CA, that cert-chain.pem (if present) starts with
// ca-cert.pem, and that ca-cert.pem verifies against root-cert.pem through
// cert-chain.pem. Without cert-chain.pem the chain sent after a leaf is
// ca-cert.pem alone, or nothing when ca-cert.pem is itself a root.
func LoadLocalCA(dir string) (*LocalCA, error) {
	fail := func(file string, err error) error {
		return fmt.Errorf("identity: load local CA %s: %w", filepath.Join(dir, file), err)
	}
	certs, err := readCertsFile(dir, CACertFile)
	if err != nil {
		return nil, fail(CACertFile, err)
	}
	caCert := certs[0]
	if len(certs) > 1 {
		return nil, fail(CACertFile, fmt.Errorf("holds %d certificates, want 1", len(certs)))
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fail(CAKeyFile, err)
	}
	signer, err := parsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fail(CAKeyFile, err)
	}
	roots, err := readCertsFile(dir, RootCertFile)
	if err != nil {
		return nil, fail(RootCertFile, err)
	}
	var chain []*x509.Certificate
	switch c, err := readCertsFile(dir, CertChainFile); {
	case errors.Is(err, os.ErrNotExist):
		if !containsCert(roots, caCert) {
			chain = []*x509.Certificate{caCert}
		}
	case err != nil:
		return nil, fail(CertChainFile, err)
	case !c[0].Equal(caCert):
		return nil, fail(CertChainFile, ErrCAChainMismatch)
	default:
		chain = c
	}

	if !caCert.BasicConstraintsValid || !caCert.IsCA ||
		(caCert.KeyUsage != 0 && caCert.KeyUsage&x509.KeyUsageCertSign == 0) {
		return nil, fail(CACertFile, ErrCANotCA)
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(caCert.PublicKey) {
		return nil, fail(CAKeyFile, ErrCAKeyMismatch)
	}
	now := time.Now()
	if now.Before(caCert.NotBefore) || now.After(caCert.NotAfter) {
		return nil, fail(CACertFile, fmt.Errorf("%w: valid %s to %s", ErrCAExpired,
			caCert.NotBefore.UTC().Format(time.RFC3339), caCert.NotAfter.UTC().Format(time.RFC3339)))
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain {
		inter.AddCert(c)
	}
	if _, err := caCert.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fail(CACertFile, fmt.Errorf("%w: %v", ErrCAUntrusted, err))
	}
	return &LocalCA{signer: signer, cert: caCert, chain: chain, roots: roots}, nil
}

// Roots returns the trust bundle (do not modify).
func (ca *LocalCA) Roots() []*x509.Certificate { return ca.roots }

// RootsPEM returns the trust bundle as PEM.
func (ca *LocalCA) RootsPEM() []byte { return EncodeCertificatesPEM(ca.roots) }

// Sign implements CA. The leaf gets id as its only SAN (a URI), no subject,
// key usage digitalSignature+keyEncipherment, extended key usage server and
// client auth, and lasts ttl (DefaultCertTTL if 0), cut short at the signing
// certificate's own expiry. A CSR that names another identity is refused.
func (ca *LocalCA) Sign(ctx context.Context, csrPEM []byte, id Identity, ttl time.Duration) (chain, roots []*x509.Certificate, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("identity: local CA sign %s: %w", id, err)
	}
	if id.IsZero() {
		return nil, nil, fmt.Errorf("identity: local CA sign: empty identity")
	}
	if ttl < 0 {
		return nil, nil, fmt.Errorf("identity: local CA sign %s: negative ttl %s", id, ttl)
	}
	if ttl == 0 {
		ttl = DefaultCertTTL
	}
	csr, err := parseCSR(csrPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: local CA sign %s: %w", id, err)
	}
	for _, u := range csr.URIs {
		if u.String() != id.String() {
			return nil, nil, fmt.Errorf("identity: local CA sign %s: CSR asks for %s: %w", id, u, ErrIdentityMismatch)
		}
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("identity: local CA sign %s: %w", id, err)
	}
	now := time.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.signer)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: local CA sign %s: %w", id, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: local CA sign %s: %w", id, err)
	}
	chain = make([]*x509.Certificate, 0, 1+len(ca.chain))
	chain = append(chain, leaf)
	chain = append(chain, ca.chain...)
	return chain, ca.roots, nil
}

func parseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil {
		return nil, errors.New("CSR is not PEM")
	}
	if b.Type != pemCSR {
		return nil, fmt.Errorf("CSR PEM block is %q, want %q", b.Type, pemCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature: %w", err)
	}
	return csr, nil
}

func readCertsFile(dir, name string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	return ParseCertificatesPEM(data)
}

// parsePrivateKeyPEM accepts the key encodings Istio's tooling writes:
// PKCS#8 "PRIVATE KEY", SEC1 "EC PRIVATE KEY" and PKCS#1 "RSA PRIVATE KEY".
func parsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM private key found")
	}
	var key any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("%w: PEM block %q", ErrCAUnsupportedKey, b.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", b.Type, err)
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrCAUnsupportedKey, key)
	}
	return s, nil
}

func containsCert(set []*x509.Certificate, c *x509.Certificate) bool {
	for _, s := range set {
		if bytes.Equal(s.Raw, c.Raw) {
			return true
		}
	}
	return false
}

// randomSerial returns a positive 128-bit serial (RFC 5280 allows up to 20
// octets; 128 random bits make collisions irrelevant).
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
