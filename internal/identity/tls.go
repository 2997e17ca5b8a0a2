package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ALPNH2 is the only protocol HBONE speaks over mTLS.
const ALPNH2 = "h2"

// tlsConfigs caches the configs built for one local identity.
type tlsConfigs struct {
	server  *tls.Config
	clients map[string]*tls.Config // key: acceptKey(accept)
}

// ServerConfig returns the (cached) mutual TLS 1.3 server config for local.
// Each handshake takes local's current certificate from the Manager (so
// renewals apply to new connections) and requires a client certificate that
// verifies, for client auth, against the current trust bundle of local and
// carries an Istio SPIFFE id in local's trust domain. ALPN offers "h2";
// session tickets are off so every connection presents and checks
// certificates. Read the client's identity with PeerIdentity.
func (m *Manager) ServerConfig(local Identity) *tls.Config {
	m.tlsMu.Lock()
	defer m.tlsMu.Unlock()
	tc := m.tlsFor(local)
	if tc.server == nil {
		tc.server = m.newServerConfig(local)
	}
	return tc.server
}

// ServerConfigFor returns a server config that picks the local identity per
// handshake (for instance from hello.Conn.LocalAddr(), the original
// destination) and then behaves as ServerConfig(picked). Build it once per
// listener, not per connection.
func (m *Manager) ServerConfigFor(pick func(hello *tls.ClientHelloInfo) (Identity, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{ALPNH2},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			id, err := pick(hello)
			if err != nil {
				return nil, fmt.Errorf("identity: pick server identity: %w", err)
			}
			return m.ServerConfig(id), nil
		},
	}
}

// ClientConfig returns the (cached) mutual TLS 1.3 client config presenting
// src's current certificate and accepting only a server whose chain verifies,
// for server auth, against src's current trust bundle and whose SPIFFE id is
// one of accept (an empty accept rejects every server). ALPN offers "h2"; no
// SNI is sent and sessions are not resumed. The config must not be modified.
func (m *Manager) ClientConfig(src Identity, accept []Identity) *tls.Config {
	key := acceptKey(accept)
	m.tlsMu.Lock()
	defer m.tlsMu.Unlock()
	tc := m.tlsFor(src)
	if cfg := tc.clients[key]; cfg != nil {
		return cfg
	}
	cfg := m.newClientConfig(src, slices.Clone(accept))
	tc.clients[key] = cfg
	return cfg
}

func (m *Manager) tlsFor(id Identity) *tlsConfigs { // expects tlsMu held
	tc := m.tls[id]
	if tc == nil {
		tc = &tlsConfigs{clients: make(map[string]*tls.Config)}
		m.tls[id] = tc
	}
	return tc
}

func (m *Manager) dropTLS(id Identity) {
	m.tlsMu.Lock()
	delete(m.tls, id)
	m.tlsMu.Unlock()
}

func acceptKey(accept []Identity) string {
	s := make([]string, len(accept))
	for i, id := range accept {
		s[i] = id.String()
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), " ")
}

func (m *Manager) newServerConfig(local Identity) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		NextProtos:             []string{ALPNH2},
		ClientAuth:             tls.RequireAnyClientCert, // verified in VerifyConnection
		SessionTicketsDisabled: true,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := m.Get(hello.Context(), local)
			if err != nil {
				return nil, err
			}
			return c.TLS, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			c, err := m.Get(m.ctx, local)
			if err != nil {
				return err
			}
			ids, err := verifyPeer(cs.PeerCertificates, c.RootPool(), x509.ExtKeyUsageClientAuth, time.Now())
			if err != nil {
				return fmt.Errorf("identity: verify client: %w", err)
			}
			for _, id := range ids {
				if id.TrustDomain == local.TrustDomain {
					return nil
				}
			}
			return fmt.Errorf("identity: verify client: %s is not in trust domain %q: %w",
				ids[0], local.TrustDomain, ErrIdentityMismatch)
		},
	}
}

func (m *Manager) newClientConfig(src Identity, accept []Identity) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{ALPNH2},
		// Server names are SPIFFE ids, not DNS names: Go's own check is
		// replaced by VerifyConnection, which checks chain, time, key usage
		// and the id. ServerName stays empty, so no SNI is sent.
		InsecureSkipVerify: true,
		GetClientCertificate: func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := m.Get(cri.Context(), src)
			if err != nil {
				return nil, err
			}
			return c.TLS, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			c, err := m.Get(m.ctx, src)
			if err != nil {
				return err
			}
			ids, err := verifyPeer(cs.PeerCertificates, c.RootPool(), x509.ExtKeyUsageServerAuth, time.Now())
			if err != nil {
				return fmt.Errorf("identity: verify server: %w", err)
			}
			for _, id := range ids {
				if slices.Contains(accept, id) {
					return nil
				}
			}
			return fmt.Errorf("identity: verify server: got %s, want one of [%s]: %w",
				ids[0], acceptKey(accept), ErrIdentityMismatch)
		},
	}
}

// verifyPeer checks a peer's chain (leaf first, as sent) against roots for
// usage at now and returns the leaf's Istio SPIFFE ids (at least one).
func verifyPeer(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, now time.Time) ([]Identity, error) {
	if len(certs) == 0 {
		return nil, ErrNoPeerCertificate
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage},
	}); err != nil {
		return nil, err
	}
	ids := identitiesOf(leaf)
	if len(ids) == 0 {
		return nil, ErrNoSPIFFEID
	}
	return ids, nil
}

// PeerIdentity returns the SPIFFE id of the peer of a connection made with
// ServerConfig or ClientConfig (whose handshake already verified it).
func PeerIdentity(cs tls.ConnectionState) (Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("identity: peer identity: %w", ErrNoPeerCertificate)
	}
	id, err := FromCertificate(cs.PeerCertificates[0])
	if err != nil {
		return Identity{}, fmt.Errorf("identity: peer identity: %w", errors.Unwrap(err))
	}
	return id, nil
}
