package identity

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// CA signs workload certificates. The Manager generates the key pair and the
// CSR; a CA only turns a CSR into a certificate chain. Implementations:
// LocalCA (FAKE_CA, plug-in CA files) and caclient.Client (Istio CA gRPC).
type CA interface {
	// Sign returns a certificate for id over the public key of csrPEM (a PEM
	// "CERTIFICATE REQUEST"), valid for about ttl (0 lets the CA choose).
	// chain is leaf first, then intermediates; roots are the trust anchors
	// the chain verifies against and that peers' chains are checked with.
	Sign(ctx context.Context, csrPEM []byte, id Identity, ttl time.Duration) (chain, roots []*x509.Certificate, err error)
}

// Errors callers can test with errors.Is.
var (
	ErrClosed            = errors.New("manager closed")
	ErrForgotten         = errors.New("the identity is no longer needed")
	ErrNoSPIFFEID        = errors.New("no Istio SPIFFE URI SAN")
	ErrNoPeerCertificate = errors.New("peer sent no certificate")
	ErrIdentityMismatch  = errors.New("identity mismatch")
)

// Certificate is one workload's leaf certificate, its private key and the
// trust bundle it came with. It is immutable; renewals replace it.
type Certificate struct {
	Identity Identity
	// TLS holds the leaf and intermediates (DER), the private key and the
	// parsed leaf, ready for tls.Config callbacks.
	TLS *tls.Certificate
	// Chain is leaf first, then intermediates, as the CA returned them.
	Chain []*x509.Certificate
	// Roots is the trust bundle used to verify peers.
	Roots               []*x509.Certificate
	NotBefore, NotAfter time.Time

	rootPool *x509.CertPool
}

// RootPool returns Roots as a pool (built once).
func (c *Certificate) RootPool() *x509.CertPool { return c.rootPool }

// Leaf returns Chain[0].
func (c *Certificate) Leaf() *x509.Certificate { return c.Chain[0] }

// allowedClockSkew is how far in the future a fresh certificate's NotBefore
// may be: a CA whose clock runs slightly ahead of ours (and does not
// backdate) must not make every fetch fail.
const allowedClockSkew = time.Minute

// NewCertificate checks what a CA returned for key and id and assembles a
// Certificate: the leaf must carry key's public key and id's SPIFFE URI SAN,
// and must verify through the intermediates to roots for both client and
// server authentication at now.
func NewCertificate(id Identity, key crypto.Signer, chain, roots []*x509.Certificate, now time.Time) (*Certificate, error) {
	if len(chain) == 0 || chain[0] == nil {
		return nil, fmt.Errorf("identity: certificate for %s: CA returned no leaf certificate", id)
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("identity: certificate for %s: CA returned no root certificate", id)
	}
	leaf := chain[0]
	pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(key.Public()) {
		return nil, fmt.Errorf("identity: certificate for %s: leaf public key does not match the CSR key", id)
	}
	got := identitiesOf(leaf)
	if len(got) == 0 {
		return nil, fmt.Errorf("identity: certificate for %s: leaf: %w", id, ErrNoSPIFFEID)
	}
	if got[0] != id {
		return nil, fmt.Errorf("identity: certificate for %s: leaf is for %s: %w", id, got[0], ErrIdentityMismatch)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	at := now
	if leaf.NotBefore.After(now) && leaf.NotBefore.Sub(now) <= allowedClockSkew {
		at = leaf.NotBefore
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		opts := x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{usage}}
		if _, err := leaf.Verify(opts); err != nil {
			return nil, fmt.Errorf("identity: certificate for %s: verify leaf: %w", id, err)
		}
	}
	der := make([][]byte, len(chain))
	for i, c := range chain {
		der[i] = c.Raw
	}
	return &Certificate{
		Identity:  id,
		TLS:       &tls.Certificate{Certificate: der, PrivateKey: key, Leaf: leaf},
		Chain:     chain,
		Roots:     roots,
		NotBefore: leaf.NotBefore,
		NotAfter:  leaf.NotAfter,
		rootPool:  pool,
	}, nil
}

// GenerateCSR makes a fresh ECDSA P-256 key and a PEM CSR for id: no subject,
// one URI SAN (the SPIFFE id), as upstream ztunnel requests them.
func GenerateCSR(id Identity) (csrPEM []byte, key *ecdsa.PrivateKey, err error) {
	if id.IsZero() {
		return nil, nil, fmt.Errorf("identity: generate CSR: empty identity")
	}
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: generate CSR: key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		SignatureAlgorithm: x509.ECDSAWithSHA256,
		URIs:               []*url.URL{id.URL()},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: generate CSR for %s: %w", id, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: der}), key, nil
}

// PEM block types.
const (
	pemCertificate = "CERTIFICATE"
	pemCSR         = "CERTIFICATE REQUEST"
)

// ParseCertificatesPEM parses every CERTIFICATE block in data. Text outside
// PEM blocks is ignored (as Go's and Istio's loaders do); a PEM block of
// another type, a certificate that does not parse, or no certificate at all
// is an error.
func ParseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != pemCertificate {
			return nil, fmt.Errorf("unexpected PEM block %q, want %q", b.Type, pemCertificate)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errNoCertificate
	}
	return out, nil
}

var errNoCertificate = errors.New("no PEM certificate found")

// EncodeCertificatesPEM returns certs as concatenated PEM blocks.
func EncodeCertificatesPEM(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: pemCertificate, Bytes: c.Raw})
	}
	return buf.Bytes()
}
