package proxy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/proxy"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds"
)

func TestE2EEchoThroughHBONE(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	payload := make([]byte, 64<<20)
	rand.Read(payload)
	cases := []struct {
		name string
		dst  string
	}{
		{"pod ip", netip.AddrPortFrom(m.server.IP, 7000).String()},
		{"service vip", "10.96.0.10:80"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// The client dials the real destination; iptables sends it to 15001.
			c, err := m.client.Dial(ctx, "tcp", tc.dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			go func() {
				c.Write(payload)
				c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(got, payload) {
				t.Fatalf("echo returned %d bytes, want %d identical", len(got), len(payload))
			}
		})
	}
	if n := m.hboneConns.Load(); n != 1 {
		t.Errorf("server accepted %d HBONE connections for sequential streams, want 1 (pooled)", n)
	}
	// Both reporters count the same bytes once the connections closed.
	waitFor(t, func() bool { return m.clientZT.Connections() == 0 && m.serverZT.Connections() == 0 })
	for _, reporter := range []string{"source", "destination"} {
		got := sumCounter(t, m.reg, "istio_tcp_received_bytes_total", "reporter", reporter)
		if got != float64(2*len(payload)) {
			t.Errorf("istio_tcp_received_bytes_total{reporter=%s} = %v, want %d", reporter, got, 2*len(payload))
		}
		if got := sumCounter(t, m.reg, "istio_tcp_sent_bytes_total", "reporter", reporter); got != float64(2*len(payload)) {
			t.Errorf("istio_tcp_sent_bytes_total{reporter=%s} = %v, want %d", reporter, got, 2*len(payload))
		}
		for _, name := range []string{"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total"} {
			if o := sumCounter(t, m.reg, name, "reporter", reporter); o != 2 {
				t.Errorf("%s{reporter=%s} = %v, want 2", name, reporter, o)
			}
		}
	}
	// Labels come from workload metadata, not from ports: one series per
	// reporter and destination, whatever the client ports were.
	if got := sumCounter(t, m.reg, "istio_tcp_connections_opened_total", "destination_workload", "server"); got != 4 {
		t.Errorf("opened{destination_workload=server} = %v, want 4", got)
	}
	if got := sumCounter(t, m.reg, "istio_tcp_connections_opened_total", "source_principal", "spiffe://cluster.local/ns/ns1/sa/client"); got != 4 {
		t.Errorf("opened{source_principal=client} = %v, want 4", got)
	}
}

func TestE2EStreamsShareConnections(t *testing.T) {
	const maxStreams, conns = 100, 1000
	m := newMesh(t, maxStreams)
	echoServer(t, m.server)
	dst := netip.AddrPortFrom(m.server.IP, 7000).String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := m.client.Dial(ctx, "tcp", dst)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			msg := []byte(fmt.Sprintf("hello %04d", i))
			c.Write(msg)
			buf := make([]byte, len(msg))
			if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, msg) {
				errs <- fmt.Errorf("conn %d: echo %q, %v", i, buf, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := int64((conns + maxStreams - 1) / maxStreams)
	if n := m.hboneConns.Load(); n > want {
		t.Fatalf("%d concurrent connections used %d HBONE connections, want ≤ %d", conns, n, want)
	}
	t.Logf("%d connections over %d HBONE connections", conns, m.hboneConns.Load())
}

func TestE2EInboundRejections(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	serverHBONE := netip.AddrPortFrom(m.server.IP, proxy.HBONEPort)
	clientID := identity.New("", "ns1", "client")
	serverID := identity.New("", "ns2", "server")

	// A raw HBONE client in the client pod (marked, so not captured).
	rawPool := func(t *testing.T, certs *identity.Manager) *hbone.Pool {
		pool, err := hbone.NewPool(hbone.PoolOptions{
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return markedDial(ctx, m.client, network, addr)
			},
			TLS: proxy.PoolTLS(certs),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Close() })
		return pool
	}
	good := rawPool(t, m.clientCerts)

	cases := []struct {
		name       string
		pool       *hbone.Pool
		accept     identity.Identity
		authority  netip.AddrPort
		wantStatus int    // 0: no HTTP status, the connection itself fails
		wantErr    string // substring of the error
		counter    [2]string
	}{
		{"allowed", good, serverID, netip.AddrPortFrom(m.server.IP, 7000), 200, "", [2]string{}},
		{"not local destination", good, serverID, netip.AddrPortFrom(m.client.IP, 7000), 400, "", [2]string{"istio_ztunnel_connection_rejected_total", "destination_not_local"}},
		{"upstream refused", good, serverID, netip.AddrPortFrom(m.server.IP, 7999), 503, "", [2]string{"istio_ztunnel_connection_rejected_total", "dial_failed"}},
		{"wrong server SAN", good, identity.New("", "ns2", "someone-else"), netip.AddrPortFrom(m.server.IP, 7000), 0, "ns2/sa/server", [2]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before float64
			if tc.counter[0] != "" {
				before = sumCounter(t, m.reg, tc.counter[0], "reason", tc.counter[1])
			}
			key := hbone.Key{Src: clientID, Dst: hbone.DstIdentities(tc.accept), Addr: serverHBONE}
			s, err := tc.pool.Connect(ctx, key, tc.authority.String(), nil)
			if tc.wantStatus == 200 {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				s.Write([]byte("ping"))
				s.CloseWrite()
				b, _ := io.ReadAll(s)
				s.Close()
				if string(b) != "ping" {
					t.Fatalf("echo = %q", b)
				}
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("connect to %s succeeded, want failure", tc.authority)
			}
			var se *hbone.StatusError
			if tc.wantStatus != 0 {
				if !errors.As(err, &se) || se.Code != tc.wantStatus {
					t.Fatalf("error = %v, want HTTP status %d", err, tc.wantStatus)
				}
			} else if errors.As(err, &se) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want a TLS failure mentioning %q", err, tc.wantErr)
			}
			if tc.counter[0] != "" {
				if got := sumCounter(t, m.reg, tc.counter[0], "reason", tc.counter[1]); got != before+1 {
					t.Fatalf("%s{reason=%s} = %v, want %v", tc.counter[0], tc.counter[1], got, before+1)
				}
			}
		})
	}

	t.Run("no client certificate", func(t *testing.T) {
		raw, err := markedDial(ctx, m.client, "tcp", serverHBONE.String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
		err = c.HandshakeContext(ctx)
		if err == nil {
			// TLS 1.3 reports the server's rejection of the (missing)
			// client certificate on the first read.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("handshake without client cert: err = %v, want a certificate error", err)
		}
	})
	t.Run("plaintext on 15008", func(t *testing.T) {
		raw, err := markedDial(ctx, m.client, "tcp", serverHBONE.String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raw.Write([]byte("CONNECT 10.0.0.1:80 HTTP/1.1\r\nHost: x\r\n\r\n"))
		raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(raw)
		if strings.Contains(string(b), "200") {
			t.Fatalf("plaintext CONNECT answered %q", b)
		}
	})
}

// TestE2EPolicyDenyClosesLiveConnection: a connection allowed, then a DENY
// pushed: it is closed within a second, and a new one is refused.
func TestE2EPolicyDenyClosesLiveConnection(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(m.server.IP, 7000).String()
	c, err := m.client.Dial(ctx, "tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("a"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("echo before deny: %v", err)
	}
	deny := fmt.Sprintf(meshConfig, m.client.IP, m.server.IP) + `
policies:
- name: deny-client
  namespace: ns2
  scope: Namespace
  action: Deny
  rules:
  - - - principals:
          - Exact: cluster.local/ns/ns1/sa/client
`
	pushed := time.Now()
	if err := xds.Load("deny.yaml", []byte(deny), m.store); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(buf)
	if err == nil {
		t.Fatal("connection still delivers data after the DENY")
	}
	if d := time.Since(pushed); d > time.Second {
		t.Fatalf("connection closed %v after the DENY, want < 1s", d)
	}
	before := sumCounter(t, m.reg, "istio_ztunnel_authorization_denied_total", "policy", "ns2/deny-client")
	c2, err := m.client.Dial(ctx, "tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write([]byte("b"))
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c2.Read(buf); err == nil {
		t.Fatalf("new connection after DENY read %d bytes", n)
	}
	waitFor(t, func() bool {
		return sumCounter(t, m.reg, "istio_ztunnel_authorization_denied_total", "policy", "ns2/deny-client") == before+1
	})
}

// denyClient is meshConfig plus an unrelated workload (so that loading
// it publishes an address change) and, with deny, a DENY for the client.
func denyClient(m *mesh, deny bool) []byte {
	cfg := strings.Replace(fmt.Sprintf(meshConfig, m.client.IP, m.server.IP), "workloads:\n", `workloads:
- uid: c1//Pod/ns3/other
  name: other
  namespace: ns3
  serviceAccount: other
  workloadIps: ["10.244.99.9"]
  protocol: HBONE
`, 1)
	if deny {
		cfg += `
policies:
- name: deny-client
  namespace: ns2
  scope: Namespace
  action: Deny
  rules:
  - - - principals:
          - Exact: cluster.local/ns/ns1/sa/client
`
	}
	return []byte(cfg)
}

// echoOnce writes one byte on c and reports whether it came back within
// the deadline.
func echoOnce(c net.Conn, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 1))
	return err
}

// TestE2EPolicyDenyDuringEvaluation: a DENY published while the server's
// policy watcher is evaluating the change before it (an unrelated
// address change) still closes the live connection.
func TestE2EPolicyDenyDuringEvaluation(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c, 5*time.Second); err != nil {
		t.Fatalf("echo before deny: %v", err)
	}
	// The watcher wakes on the address change and reads the state; the
	// DENY lands right after that read. Two things must not let the other
	// change's config, which has no DENY, replace it: a read from before
	// that change (the watcher's first, if its goroutine started late), so
	// the hook waits for a snapshot holding the change; and the change's
	// second step (a file load replaces addresses, then policies, each
	// published), so the DENY is loaded only once that load returned.
	pushed, loaded := make(chan struct{}), make(chan struct{})
	var once sync.Once
	pushDeny := func(s *state.Snapshot) bool {
		if s.WorkloadByUID("c1//Pod/ns3/other") == nil {
			return false
		}
		once.Do(func() {
			select {
			case <-loaded:
			case <-time.After(10 * time.Second):
				t.Error("the address change's load never returned")
			}
			if err := xds.Load("deny.yaml", denyClient(m, true), m.store); err != nil {
				t.Error(err)
			}
			close(pushed)
		})
		return true
	}
	m.onServerState.Store(&pushDeny)
	if err := xds.Load("other.yaml", denyClient(m, false), m.store); err != nil {
		t.Fatal(err)
	}
	close(loaded)
	select {
	case <-pushed:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's policy watcher never read the state after the address change")
	}
	// The watcher closes the connection after the hook returns, on its
	// own goroutine: an echo sent at once can still make the round trip
	// (CI, under -race, saw it), so the DENY must take effect within a
	// bound. The watcher that missed the DENY left the connection open for
	// good.
	for deadline := time.Now().Add(5 * time.Second); echoOnce(c, 3*time.Second) == nil; {
		if time.Now().After(deadline) {
			t.Fatal("connection still delivers data 5 s after the DENY")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestE2EPolicyDenyDuringSetUp: a DENY published after the server admitted
// a connection but before it tracks it (while it dials the destination)
// closes the connection: the watcher's evaluation of that change did not
// see it.
func TestE2EPolicyDenyDuringSetUp(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pushDeny := func() {
		if err := xds.Load("deny.yaml", denyClient(m, true), m.store); err != nil {
			t.Error(err)
		}
		// Long enough for the watcher to evaluate the change before the
		// connection is tracked.
		time.Sleep(100 * time.Millisecond)
	}
	m.onServerDial.Store(&pushDeny)
	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c, 3*time.Second); err == nil {
		t.Fatal("a connection admitted just before the DENY still delivers data")
	}
	if m.onServerDial.Load() != nil {
		t.Fatal("the server never dialed the destination")
	}
}

// TestE2ECertRenewalUnderTraffic: with 3 s certificates (the 30 s,
// scaled down), streams over one pooled HBONE connection keep working
// across several renewals, including after the certificate the connection
// was opened with has expired.
func TestE2ECertRenewalUnderTraffic(t *testing.T) {
	m := newMeshTTL(t, 100, 3*time.Second)
	echoServer(t, m.server)
	dst := netip.AddrPortFrom(m.server.IP, 7000).String()
	clientID := identity.New("", "ns1", "client")
	serials := map[string]bool{}
	deadline := time.Now().Add(8 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := m.client.Dial(ctx, "tcp", dst)
		if err != nil {
			cancel()
			t.Fatalf("request %d: %v", i, err)
		}
		msg := []byte(fmt.Sprintf("req %d", i))
		c.Write(msg)
		buf := make([]byte, len(msg))
		_, err = io.ReadFull(c, buf)
		c.Close()
		cancel()
		if err != nil || !bytes.Equal(buf, msg) {
			t.Fatalf("request %d after %d renewals: %q %v", i, len(serials)-1, buf, err)
		}
		cert, err := m.clientCerts.Get(context.Background(), clientID)
		if err != nil {
			t.Fatal(err)
		}
		serials[cert.Leaf().SerialNumber.String()] = true
		time.Sleep(200 * time.Millisecond)
	}
	if len(serials) < 4 {
		t.Fatalf("saw %d client certificates in 8 s of 3 s certs, want ≥ 4 (renewal at half life)", len(serials))
	}
	if n := m.hboneConns.Load(); n != 1 {
		t.Errorf("traffic used %d HBONE connections, want the one pooled connection", n)
	}
}

// TestE2EPlaintextInbound: TCP from outside the mesh reaches the server
// pod's 15006 (iptables PREROUTING) and is delivered; policy applies with
// no identity.
func TestE2EPlaintextInbound(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(m.server.IP, 7000).String()
	// Marked, so the client pod's own capture lets it out in plaintext.
	c, err := markedDial(ctx, m.client, "tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("plain"))
	buf := make([]byte, 5)
	_, err = io.ReadFull(c, buf)
	c.Close()
	if err != nil || string(buf) != "plain" {
		t.Fatalf("plaintext echo = %q, %v", buf, err)
	}
	waitFor(t, func() bool {
		return sumCounter(t, m.reg, "istio_tcp_connections_closed_total", "connection_security_policy", "unknown") == 1
	})
	// A policy that requires an identity now refuses plaintext.
	deny := fmt.Sprintf(meshConfig, m.client.IP, m.server.IP) + `
policies:
- name: require-mtls
  namespace: ns2
  scope: Namespace
  action: Deny
  rules:
  - - - notPrincipals:
          - Presence: {}
`
	if err := xds.Load("deny.yaml", []byte(deny), m.store); err != nil {
		t.Fatal(err)
	}
	c, err = markedDial(ctx, m.client, "tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("plain"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("plaintext allowed through a require-mTLS policy (%d bytes)", n)
	}
	waitFor(t, func() bool {
		return sumCounter(t, m.reg, "istio_ztunnel_authorization_denied_total", "policy", "ns2/require-mtls") == 1
	})
}

// TestE2ELiveByteMetrics: bytes of a connection that stays open show up in
// istio_tcp_*_bytes_total while it runs, and are not counted twice at close.
func TestE2ELiveByteMetrics(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("x"), 10000)
	c.Write(msg)
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	for _, reporter := range []string{"source", "destination"} {
		waitFor(t, func() bool {
			return sumCounter(t, m.reg, "istio_tcp_received_bytes_total", "reporter", reporter) == 10000 &&
				sumCounter(t, m.reg, "istio_tcp_sent_bytes_total", "reporter", reporter) == 10000
		})
	}
	c.Close()
	waitFor(t, func() bool { return m.clientZT.Connections() == 0 && m.serverZT.Connections() == 0 })
	for _, reporter := range []string{"source", "destination"} {
		if got := sumCounter(t, m.reg, "istio_tcp_received_bytes_total", "reporter", reporter); got != 10000 {
			t.Errorf("received bytes{reporter=%s} after close = %v, want 10000 (counted once)", reporter, got)
		}
	}
}
