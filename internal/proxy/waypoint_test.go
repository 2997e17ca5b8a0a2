package proxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/identitytest"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/xds"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestE2EServiceWaypoint: a connection to a service that has a waypoint
// goes over HBONE to the waypoint (its 15008), verified as the waypoint's
// identity, with the original destination (VIP:port) as :authority; the
// waypoint then decides where it goes (here it answers itself).
func TestE2EServiceWaypoint(t *testing.T) {
	m, wp := newWaypointMesh(t)

	// The fake waypoint: an HBONE server with the waypoint's identity.
	certs := identitytest.NewManager(t, m.ca)
	authorities := make(chan string, 1)
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS: certs.ServerConfig(identity.New("", "ns2", "waypoint")),
		Handler: func(ctx context.Context, req *hbone.Request) {
			authorities <- req.Authority.String()
			s, err := req.Accept(nil)
			if err != nil {
				return
			}
			defer s.Close()
			io.WriteString(s, "from waypoint")
			s.CloseWrite()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := wp.Listen("tcp", netip.AddrPortFrom(wp.IP, 15008).String())
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "from waypoint" {
		t.Fatalf("reply %q (%v), want the waypoint's", b, err)
	}
	select {
	case a := <-authorities:
		if a != "10.96.0.10:80" {
			t.Fatalf(":authority at the waypoint = %s, want the original destination 10.96.0.10:80", a)
		}
	case <-ctx.Done():
		t.Fatal("the waypoint never got a CONNECT")
	}
}

// newWaypointMesh is newMesh with a waypoint pod on the server's node in
// front of service echo (10.96.0.10:80): a connection to the service goes
// to the waypoint's 15008.
func newWaypointMesh(t *testing.T) (*mesh, *nstest.Pod) {
	m := newMesh(t, 100)
	wp, err := m.server.Node.AddPod("wp")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`
workloads:
- {uid: c1//Pod/ns1/client, name: client, namespace: ns1, serviceAccount: client, workloadIps: ["%[1]s"], protocol: HBONE}
- uid: c1//Pod/ns2/server
  name: server
  namespace: ns2
  serviceAccount: server
  workloadIps: ["%[2]s"]
  protocol: HBONE
  services:
    "ns2/echo.ns2.svc.cluster.local":
      80: 7000
- {uid: c1//Pod/ns2/waypoint, name: waypoint, namespace: ns2, serviceAccount: waypoint, workloadIps: ["%[3]s"], protocol: HBONE}
services:
- name: echo
  namespace: ns2
  hostname: echo.ns2.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports:
    80: 7000
  waypoint:
    destination: /%[3]s
    hboneMtlsPort: 15008
`, m.client.IP, m.server.IP, wp.IP)
	if err := xds.Load("waypoint.yaml", []byte(cfg), m.store); err != nil {
		t.Fatal(err)
	}

	return m, wp
}

// TestE2EWaypointGetsNoEarlyData: a client's first bytes are not sent with
// the CONNECT to a waypoint. The fake waypoint here is an Envoy that
// rejects early CONNECT data (reject_early_connect_data): DATA on the
// stream before its 200 gets a 400. The client writes at once, before the
// tunnel can have been opened, and must still get through.
func TestE2EWaypointGetsNoEarlyData(t *testing.T) {
	m, wp := newWaypointMesh(t)
	certs := identitytest.NewManager(t, m.ca)
	ln, err := wp.Listen("tcp", netip.AddrPortFrom(wp.IP, 15008).String())
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := certs.ServerConfig(identity.New("", "ns2", "waypoint"))
	serveConns(t, ln, func(c net.Conn) { strictWaypoint(tls.Server(c, tlsCfg)) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hi"))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "accepted: hi" {
		t.Fatalf("reply %q (%v), want the waypoint to have accepted the tunnel", b, err)
	}
}

// strictWaypoint serves one HBONE connection's first stream: after the
// CONNECT it waits 200 ms for DATA; any arriving then is early (400),
// otherwise it answers 200, reads two bytes and answers with them.
func strictWaypoint(sc *tls.Conn) {
	defer sc.Close()
	if sc.Handshake() != nil {
		return
	}
	fr := http2.NewFramer(sc, sc)
	fr.WriteSettings()
	if _, err := io.ReadFull(sc, make([]byte, len(http2.ClientPreface))); err != nil {
		return
	}
	var id uint32
	var data []byte
	deadline := time.Time{}
	answered := false
	for {
		sc.SetReadDeadline(deadline)
		f, err := fr.ReadFrame()
		if ne, ok := err.(net.Error); ok && ne.Timeout() && !answered {
			answer(fr, id, "200", false)
			answered, deadline = true, time.Now().Add(5*time.Second)
			continue
		}
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			if id == 0 {
				id, deadline = f.StreamID, time.Now().Add(200*time.Millisecond)
			}
		case *http2.DataFrame:
			if f.StreamID != id {
				continue
			}
			if !answered {
				answer(fr, id, "400", true)
				return
			}
			data = append(data, f.Data()...)
			if len(data) >= 2 {
				fr.WriteData(id, true, append([]byte("accepted: "), data...))
				time.Sleep(100 * time.Millisecond) // let it go out before the close
				return
			}
		}
	}
}

func answer(fr *http2.Framer, id uint32, status string, end bool) {
	var b bytes.Buffer
	hpack.NewEncoder(&b).WriteField(hpack.HeaderField{Name: ":status", Value: status})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b.Bytes(), EndHeaders: true, EndStream: end})
}
