package identity_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

type handshake struct {
	peer identity.Identity
	alpn string
	err  error
}

// serveTLS accepts TLS connections on 127.0.0.1:0 with cfg and reports each
// server-side handshake; after a good one it writes one byte.
func serveTLS(t *testing.T, cfg *tls.Config) (string, <-chan handshake) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan handshake, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var h handshake
			if h.err = tc.HandshakeContext(ctx); h.err == nil {
				h.alpn = tc.ConnectionState().NegotiatedProtocol
				h.peer, h.err = identity.PeerIdentity(tc.ConnectionState())
				_, _ = tc.Write([]byte{'k'})
			}
			cancel()
			_ = c.Close()
			results <- h
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String(), results
}

// dialTLS handshakes with cfg and reads the server's byte, so a rejection
// the server sends after the client's side completed is seen too.
func dialTLS(t *testing.T, addr string, cfg *tls.Config) handshake {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc := tls.Client(c, cfg)
	var h handshake
	if h.err = tc.HandshakeContext(ctx); h.err != nil {
		return h
	}
	_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, h.err = tc.Read(make([]byte, 1)); h.err != nil {
		return h
	}
	h.alpn = tc.ConnectionState().NegotiatedProtocol
	h.peer, h.err = identity.PeerIdentity(tc.ConnectionState())
	return h
}

// leafFrom signs a hand-made leaf with root, for certificates LocalCA would
// never issue.
func leafFrom(t *testing.T, root *keyCert, mutate func(*x509.Certificate)) *tls.Certificate {
	t.Helper()
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: bigInt(serial),
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{cliID.URL()},
	}
	mutate(tmpl)
	kc := issue(t, tmpl, root)
	return &tls.Certificate{Certificate: [][]byte{kc.cert.Raw}, PrivateKey: kc.key, Leaf: kc.cert}
}

var (
	srvID = identity.New("", "srv", "server")
	cliID = identity.New("", "cli", "client")
)

func TestMutualTLS(t *testing.T) {
	root := issue(t, validCA("mesh root"), nil)
	meshCA, err := identity.LoadLocalCA(writeDir(t, map[string][]byte{
		identity.CACertFile: certsPEM(root), identity.CAKeyFile: keyPEM(t, root.key, "PRIVATE KEY"),
		identity.RootCertFile: certsPEM(root),
	}))
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := identity.NewLocalCA("")
	if err != nil {
		t.Fatal(err)
	}
	srvM := newManager(t, identity.ManagerOptions{CA: meshCA})
	cliM := newManager(t, identity.ManagerOptions{CA: meshCA})
	otherM := newManager(t, identity.ManagerOptions{CA: otherCA})
	for _, m := range []*identity.Manager{srvM, cliM, otherM} {
		t.Cleanup(func() { _ = m.Close() })
	}
	addr, results := serveTLS(t, srvM.ServerConfig(srvID))

	certOf := func(m *identity.Manager, id identity.Identity) *tls.Certificate {
		c, err := m.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return c.TLS
	}
	presenting := func(c *tls.Certificate, maxVersion uint16) *tls.Config {
		cfg := &tls.Config{InsecureSkipVerify: true, MaxVersion: maxVersion, NextProtos: []string{"h2"}}
		if c != nil {
			cfg.Certificates = []tls.Certificate{*c}
		}
		return cfg
	}
	for _, tc := range []struct {
		name          string
		client        *tls.Config
		wantClientErr string // "" → success, peer srvID
		wantServerErr string // "" → success, peer cliID
	}{
		{name: "mutual ok", client: cliM.ClientConfig(cliID, []identity.Identity{srvID})},
		{name: "accepts one of several", client: cliM.ClientConfig(cliID, []identity.Identity{cliID, srvID})},
		{name: "server identity not accepted",
			client:        cliM.ClientConfig(cliID, []identity.Identity{identity.New("", "srv", "other")}),
			wantClientErr: "got spiffe://cluster.local/ns/srv/sa/server, want one of [spiffe://cluster.local/ns/srv/sa/other]: identity mismatch",
			wantServerErr: "bad certificate"},
		{name: "nothing accepted", client: cliM.ClientConfig(cliID, nil),
			wantClientErr: "identity mismatch", wantServerErr: "bad certificate"},
		{name: "server from untrusted CA", client: otherM.ClientConfig(cliID, []identity.Identity{srvID}),
			wantClientErr: "identity: verify server: x509: certificate signed by unknown authority", wantServerErr: "bad certificate"},
		{name: "no client certificate", client: presenting(nil, 0),
			wantClientErr: "certificate required", wantServerErr: "client didn't provide a certificate"},
		{name: "client from untrusted CA", client: presenting(certOf(otherM, cliID), 0),
			wantClientErr: "bad certificate", wantServerErr: "identity: verify client: x509: certificate signed by unknown authority"},
		{name: "TLS 1.2 client", client: presenting(certOf(cliM, cliID), tls.VersionTLS12),
			wantClientErr: "protocol version", wantServerErr: "client offered only unsupported versions"},
		{name: "client in another trust domain", client: presenting(certOf(cliM, identity.New("other.td", "cli", "client")), 0),
			wantClientErr: "bad certificate",
			wantServerErr: `spiffe://other.td/ns/cli/sa/client is not in trust domain "cluster.local": identity mismatch`},
		{name: "client without SPIFFE id", client: presenting(leafFrom(t, root, func(c *x509.Certificate) {
			c.URIs, c.DNSNames = nil, []string{"client.example"}
		}), 0), wantClientErr: "bad certificate", wantServerErr: "identity: verify client: no Istio SPIFFE URI SAN"},
		{name: "client certificate only for server auth", client: presenting(leafFrom(t, root, func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		}), 0), wantClientErr: "bad certificate", wantServerErr: "x509: certificate specifies an incompatible key usage"},
		{name: "expired client certificate", client: presenting(leafFrom(t, root, func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		}), 0), wantClientErr: "bad certificate", wantServerErr: "x509: certificate has expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := dialTLS(t, addr, tc.client)
			srv := <-results
			check := func(side string, h handshake, wantErr string, wantPeer identity.Identity) {
				t.Helper()
				if wantErr == "" {
					if h.err != nil {
						t.Fatalf("%s: %v", side, h.err)
					}
					if h.peer != wantPeer || h.alpn != identity.ALPNH2 {
						t.Fatalf("%s: peer %v alpn %q, want %v h2", side, h.peer, h.alpn, wantPeer)
					}
					return
				}
				if h.err == nil || !strings.Contains(h.err.Error(), wantErr) {
					t.Fatalf("%s error = %v, want it to contain %q", side, h.err, wantErr)
				}
			}
			check("server", srv, tc.wantServerErr, cliID)
			check("client", cli, tc.wantClientErr, srvID)
		})
	}
	// Hand-made servers the client must refuse: the client's own checks of
	// chain time, key usage and SPIFFE id.
	for _, tc := range []struct {
		name    string
		mutate  func(*x509.Certificate)
		wantErr string
	}{
		{name: "server certificate only for client auth", mutate: func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}, wantErr: "x509: certificate specifies an incompatible key usage"},
		{name: "expired server certificate", mutate: func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		}, wantErr: "x509: certificate has expired"},
		{name: "server without SPIFFE id", mutate: func(c *x509.Certificate) {
			c.URIs, c.DNSNames = nil, []string{"server.example"}
		}, wantErr: "identity: verify server: no Istio SPIFFE URI SAN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvCert := leafFrom(t, root, func(c *x509.Certificate) {
				c.URIs = []*url.URL{srvID.URL()}
				tc.mutate(c)
			})
			addr, results := serveTLS(t, &tls.Config{
				Certificates: []tls.Certificate{*srvCert}, ClientAuth: tls.RequireAnyClientCert,
				MinVersion: tls.VersionTLS13, NextProtos: []string{identity.ALPNH2},
			})
			cli := dialTLS(t, addr, cliM.ClientConfig(cliID, []identity.Identity{srvID}))
			<-results
			if cli.err == nil || !strings.Contains(cli.err.Error(), tc.wantErr) {
				t.Fatalf("client error = %v, want it to contain %q", cli.err, tc.wantErr)
			}
		})
	}
}

func TestServerConfigForPicksIdentity(t *testing.T) {
	m := newManager(t, identity.ManagerOptions{CA: newTestCA(t).ca})
	t.Cleanup(func() { _ = m.Close() })
	picked := identity.New("", "pod-ns", "pod-sa")
	addr, results := serveTLS(t, m.ServerConfigFor(func(h *tls.ClientHelloInfo) (identity.Identity, error) {
		if _, ok := h.Conn.LocalAddr().(*net.TCPAddr); !ok {
			return identity.Identity{}, errors.New("not TCP")
		}
		return picked, nil
	}))
	cli := dialTLS(t, addr, m.ClientConfig(cliID, []identity.Identity{picked}))
	if srv := <-results; srv.err != nil || srv.peer != cliID {
		t.Fatalf("server: %v %v", srv.peer, srv.err)
	}
	if cli.err != nil || cli.peer != picked {
		t.Fatalf("client: %v %v", cli.peer, cli.err)
	}
}

func TestTLSConfigsCachedAndCurrent(t *testing.T) {
	m := newManager(t, identity.ManagerOptions{CA: newTestCA(t).ca})
	t.Cleanup(func() { _ = m.Close() })
	if m.ServerConfig(srvID) != m.ServerConfig(srvID) {
		t.Fatal("ServerConfig not cached")
	}
	a, b := identity.New("", "x", "a"), identity.New("", "x", "b")
	c1 := m.ClientConfig(cliID, []identity.Identity{a, b})
	if c2 := m.ClientConfig(cliID, []identity.Identity{b, a, b}); c2 != c1 {
		t.Fatal("ClientConfig not cached for the same accept set")
	}
	if m.ClientConfig(cliID, []identity.Identity{a}) == c1 {
		t.Fatal("different accept sets share a config")
	}

	// The server config takes the certificate per handshake: once srvID's
	// certificate is replaced, the same config presents the new one.
	cfg := m.ServerConfig(srvID)
	addr, results := serveTLS(t, cfg)
	serialOf := func() string {
		t.Helper()
		var seen string
		ccfg := m.ClientConfig(cliID, []identity.Identity{srvID}).Clone()
		ccfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			c, err := x509.ParseCertificate(raw[0])
			if err == nil {
				seen = c.SerialNumber.String()
			}
			return err
		}
		if h := dialTLS(t, addr, ccfg); h.err != nil {
			t.Fatal(h.err)
		}
		<-results
		return seen
	}
	first := serialOf()
	m.Forget(srvID)
	if second := serialOf(); second == first {
		t.Fatal("server kept presenting the forgotten certificate")
	}
}
