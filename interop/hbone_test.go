package interop

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	istiohbone "istio.io/istio/pkg/hbone"
	istiolog "istio.io/istio/pkg/log"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/identitytest"
)

// hboneTimeout bounds every HBONE exchange; a healthy one takes
// milliseconds.
const hboneTimeout = 10 * time.Second

var (
	serverID = identity.New("cluster.local", "default", "server")
	clientID = identity.New("cluster.local", "default", "client")
)

// Istio's hbone package logs every CONNECT at info level (and the refused
// upstream case at error level); the tests check outcomes, so keep quiet.
func quietIstioHBONE(t *testing.T) {
	t.Helper()
	if s := istiolog.FindScope("hbone"); s != nil {
		old := s.GetOutputLevel()
		s.SetOutputLevel(istiolog.NoneLevel)
		t.Cleanup(func() { s.SetOutputLevel(old) })
	}
}

// meshPKI is two identity Managers (server and client) sharing one CA.
func meshPKI(t *testing.T) (srv, cli *identity.Manager) {
	t.Helper()
	ca := identitytest.NewLocalCA(t, "cluster.local")
	return identitytest.NewManager(t, ca), identitytest.NewManager(t, ca)
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// Target ports of the CONNECT authority select what our test server's
// handler does, after the classic inetd services.
const (
	portEcho    = 7  // echo until the client half-closes
	portDiscard = 9  // refuse: answer 403
	portDaytime = 13 // server speaks first, then closes
)

var greeting = []byte("hello from ztunnel-go\n")

// seen is what our server observed of one CONNECT from Istio's dialer.
type seen struct {
	authority netip.AddrPort
	peer      identity.Identity
	peerErr   error
}

// TestIstioDialerToOurServer: Istio's HBONE client (pkg/hbone.NewDialer,
// HTTP/2 over TLS with a client certificate from our Manager) opens CONNECT
// streams to our HBONE server.
func TestIstioDialerToOurServer(t *testing.T) {
	checkLeaks(t)
	quietIstioHBONE(t)
	srvMgr, cliMgr := meshPKI(t)

	seenc := make(chan seen, 16)
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS: srvMgr.ServerConfig(serverID),
		Handler: func(ctx context.Context, req *hbone.Request) {
			s := seen{authority: req.Authority}
			if req.TLS != nil {
				s.peer, s.peerErr = identity.PeerIdentity(*req.TLS)
			} else {
				s.peerErr = errors.New("no TLS state")
			}
			seenc <- s
			switch req.Authority.Port() {
			case portDiscard:
				_ = req.Reject(http.StatusForbidden, "test_refused")
				return
			case portEcho:
				st, err := req.Accept(nil)
				if err != nil {
					return
				}
				_, _ = io.Copy(st, st)
				_ = st.CloseWrite()
			case portDaytime:
				st, err := req.Accept(nil)
				if err != nil {
					return
				}
				_, _ = st.Write(greeting)
				_ = st.CloseWrite()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-served
	})

	// One dialer for every case: its HTTP/2 connection carries each case's
	// stream in turn.
	d := istiohbone.NewDialer(istiohbone.Config{
		ProxyAddress: ln.Addr().String(),
		TLS:          cliMgr.ClientConfig(clientID, []identity.Identity{serverID}),
	})
	tests := []struct {
		name    string
		port    uint16
		send    []byte
		want    []byte
		wantErr string // DialContext error
	}{
		{"echo 5 bytes", portEcho, []byte("ping\n"), []byte("ping\n"), ""},
		{"echo 1 MiB", portEcho, payload(1 << 20), payload(1 << 20), ""},
		{"server speaks first", portDaytime, nil, greeting, ""},
		{"refused with 403", portDiscard, nil, nil, "403"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			target := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), tc.port)
			ctx, cancel := context.WithTimeout(context.Background(), hboneTimeout)
			defer cancel()
			c, err := d.DialContext(ctx, "tcp", target.String())
			if err == nil {
				defer c.Close()
			}
			if tc.wantErr == "" && err != nil {
				t.Fatalf("DialContext: %v", err)
			}
			select {
			case s := <-seenc:
				if s.authority != target || s.peerErr != nil || s.peer != clientID {
					t.Errorf("server saw authority %v peer %v (%v), want %v peer %v", s.authority, s.peer, s.peerErr, target, clientID)
				}
			case <-ctx.Done():
				t.Fatal("our server's handler never saw the CONNECT")
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DialContext error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			_ = c.SetDeadline(time.Now().Add(hboneTimeout))
			// Istio's dialer returns one end of a net.Pipe, which cannot
			// half-close: the echo case reads exactly what it sent, the
			// server-first case reads to the server's END_STREAM.
			// Nothing to send: no Write at all. Even an empty Write on a
			// net.Pipe waits for the other end to take it, and once the
			// server ended the stream Istio's dialer closes its end: the
			// server-first case then failed with "closed pipe" now and
			// then (1 in 40 runs).
			wrote := make(chan error, 1)
			if len(tc.send) == 0 {
				wrote <- nil
			} else {
				go func() {
					_, err := c.Write(tc.send)
					wrote <- err
				}()
			}
			var got []byte
			if tc.port == portEcho {
				got = make([]byte, len(tc.want))
				_, err = io.ReadFull(c, got)
			} else {
				got, err = io.ReadAll(c)
			}
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("read %d bytes, want %d (equal: %v)", len(got), len(tc.want), bytes.Equal(got, tc.want))
			}
		})
	}

	// The verification handed to Istio's dialer is in force: a dialer that
	// accepts only another identity refuses our server's certificate, and
	// no CONNECT reaches the handler.
	t.Run("server identity not accepted", func(t *testing.T) {
		other := identity.New("cluster.local", "default", "someone-else")
		bad := istiohbone.NewDialer(istiohbone.Config{
			ProxyAddress: ln.Addr().String(),
			TLS:          cliMgr.ClientConfig(clientID, []identity.Identity{other}),
		})
		c, err := bad.DialContext(context.Background(), "tcp", "127.0.0.1:7")
		if err == nil {
			c.Close()
			t.Fatal("DialContext succeeded although the server's identity is not accepted")
		}
		if !errors.Is(err, identity.ErrIdentityMismatch) && !strings.Contains(err.Error(), "want one of") {
			t.Errorf("DialContext error %v, want an identity mismatch", err)
		}
		select {
		case s := <-seenc:
			t.Errorf("handler reached for %v", s.authority)
		default:
		}
	})
}

// backend is a TCP server on 127.0.0.1 that Istio's HBONE server dials:
// it echoes until the peer half-closes, or, if first is set, sends first
// and closes.
func backend(t *testing.T, first []byte) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(hboneTimeout))
				if first != nil {
					_, _ = c.Write(first)
					return
				}
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// closedPort returns a 127.0.0.1 port nothing listens on (one just freed).
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(ln.Addr().String())
	_ = ln.Close()
	return ap
}

// TestOurPoolToIstioServer: our HBONE client pool opens CONNECT streams to
// Istio's HBONE server (pkg/hbone.NewServer), which dials the authority and
// copies bytes both ways.
//
// Istio's NewServer enables HTTP/1 and unencrypted HTTP/2 (h2c) only: over
// TLS, net/http then offers ALPN "http/1.1" alone, and HBONE is HTTP/2 over
// mutual TLS (our pool requires ALPN "h2", as upstream ztunnel does). The
// test therefore also enables HTTP/2 on the returned *http.Server, a
// one-field change; Istio's CONNECT handler, which is what is under test,
// is unchanged.
func TestOurPoolToIstioServer(t *testing.T) {
	checkLeaks(t)
	quietIstioHBONE(t)
	srvMgr, cliMgr := meshPKI(t)

	hs := istiohbone.NewServer()
	if hs.Protocols == nil || !hs.Protocols.HTTP2() {
		t.Logf("Istio's hbone.NewServer has no HTTP/2 over TLS (protocols %v); enabling it", hs.Protocols)
		if hs.Protocols == nil {
			hs.Protocols = new(http.Protocols)
			hs.Protocols.SetHTTP1(true)
		}
		hs.Protocols.SetHTTP2(true)
	}
	hs.TLSConfig = srvMgr.ServerConfig(serverID)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		_ = hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Istio server: %v", err)
		}
	})

	pool, err := hbone.NewPool(hbone.PoolOptions{
		TLS: func(k hbone.Key) (*tls.Config, error) {
			return cliMgr.ClientConfig(k.Src, []identity.Identity{serverID}), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Close() })
	key := hbone.Key{Src: clientID, Dst: hbone.DstIdentities(serverID), Addr: netip.MustParseAddrPort(ln.Addr().String())}

	echo, daytime, refused := backend(t, nil), backend(t, greeting), closedPort(t)
	tests := []struct {
		name   string
		target netip.AddrPort
		send   []byte
		want   []byte
	}{
		{"echo 5 bytes", echo, []byte("ping\n"), []byte("ping\n")},
		{"echo 1 MiB", echo, payload(1 << 20), payload(1 << 20)},
		{"server speaks first", daytime, nil, greeting},
		// Istio's handler flushes 200 before it dials the upstream, so a
		// refused upstream shows as an empty stream, not as an error status.
		{"upstream refused", refused, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hboneTimeout)
			defer cancel()
			st, err := pool.Connect(ctx, key, tc.target.String(), nil)
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			defer st.Close()
			if id, err := identity.PeerIdentity(st.ConnectionState()); err != nil || id != serverID {
				t.Errorf("Istio server presented %v (%v), want %v", id, err, serverID)
			}
			// Cases that send nothing leave the stream to the server, which
			// may already have ended it: writing then is an error.
			wrote := make(chan error, 1)
			go func() {
				var err error
				if len(tc.send) > 0 {
					if _, err = st.Write(tc.send); err == nil {
						err = st.CloseWrite() // END_STREAM: Istio half-closes the upstream
					}
				}
				wrote <- err
			}()
			got, err := readAllTimeout(st, hboneTimeout)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("read %d bytes, want %d (equal: %v)", len(got), len(tc.want), bytes.Equal(got, tc.want))
			}
		})
	}
}

// readAllTimeout is io.ReadAll for a Stream, which has no deadlines: on
// timeout it resets the stream so the read returns.
func readAllTimeout(st *hbone.Stream, d time.Duration) ([]byte, error) {
	timer := time.AfterFunc(d, func() { _ = st.Reset() })
	defer timer.Stop()
	return io.ReadAll(st)
}
