package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/identitytest"
	"github.com/ztunnel-go/ztunnel/internal/xds"
)

// TestE2EServiceWaypoint: a connection to a service that has a waypoint
// goes over HBONE to the waypoint (its 15008), verified as the waypoint's
// identity, with the original destination (VIP:port) as :authority; the
// waypoint then decides where it goes (here it answers itself).
func TestE2EServiceWaypoint(t *testing.T) {
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
