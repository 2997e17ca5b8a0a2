package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

const (
	addressType = "type.googleapis.com/istio.workload.Address"
	authzType   = "type.googleapis.com/istio.security.Authorization"
)

func testWorkload(uid, name string, ip byte) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid: uid, Name: name, Namespace: "ns", ServiceAccount: name,
		Addresses: [][]byte{{10, 1, 0, ip}}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
	}}}
}

// dumpUIDs returns the workload uids and policy names in config_dump.
func dumpUIDs(t *testing.T, admin string) (workloads, policies []string) {
	t.Helper()
	_, body := get(t, "http://"+admin+"/config_dump")
	var d struct {
		Workloads []struct{ UID string }  `json:"workloads"`
		Policies  []struct{ Name string } `json:"policies"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	for _, w := range d.Workloads {
		workloads = append(workloads, w.UID)
	}
	for _, p := range d.Policies {
		policies = append(policies, p.Name)
	}
	return workloads, policies
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestXDSEndToEnd runs the real binary against a go-control-plane delta
// server: pushes add, update and remove workloads and policies and the
// config_dump follows; a malformed resource is NACKed with a readable error
// while the rest keeps serving; the server restarts and state converges.
func TestXDSEndToEnd(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAddress("c//Pod/ns/a", testWorkload("c//Pod/ns/a", "a", 1))
	srv.SetAuthorization("ns/allow-a", &securitypb.Authorization{Name: "allow-a", Namespace: "ns", Scope: securitypb.Scope_NAMESPACE})
	p := startZtunnel(t, "XDS_ADDRESS="+srv.URL(), "FAKE_CA=true", "PROXY_MODE=shared")
	admin := p.addrs["admin"]
	has := func(list []string, v string) bool {
		for _, x := range list {
			if x == v {
				return true
			}
		}
		return false
	}
	eventually(t, "initial push in config_dump", func() bool {
		w, pol := dumpUIDs(t, admin)
		return has(w, "c//Pod/ns/a") && has(pol, "allow-a")
	})

	srv.SetAddress("c//Pod/ns/b", testWorkload("c//Pod/ns/b", "b", 2))
	srv.Remove(authzType, "ns/allow-a")
	eventually(t, "add b and remove the policy", func() bool {
		w, pol := dumpUIDs(t, admin)
		return has(w, "c//Pod/ns/b") && !has(pol, "allow-a")
	})

	// A workload with a 3-byte address is rejected alone.
	from := srv.RequestCount()
	bad := testWorkload("c//Pod/ns/bad", "bad", 3)
	bad.GetWorkload().Addresses = [][]byte{{10, 1, 0}}
	srv.SetAddress("c//Pod/ns/bad", bad)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	nack, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool { return r.NACK() })
	if err != nil {
		t.Fatalf("no NACK for a malformed workload: %v", err)
	}
	if msg := nack.Msg.GetErrorDetail().GetMessage(); !strings.Contains(msg, "c//Pod/ns/bad") || !strings.Contains(msg, "want 4 or 16 bytes, got 3") {
		t.Fatalf("NACK error_detail = %q, want the resource name and the reason", msg)
	}
	if w, _ := dumpUIDs(t, admin); !has(w, "c//Pod/ns/a") || !has(w, "c//Pod/ns/b") || has(w, "c//Pod/ns/bad") {
		t.Fatalf("after NACK the dump has %v, want a and b only", w)
	}

	// istiod goes away; meanwhile a is removed and c added; it comes back.
	srv.Stop()
	srv.Remove(addressType, "c//Pod/ns/a")
	srv.Remove(addressType, "c//Pod/ns/bad")
	srv.SetAddress("c//Pod/ns/c", testWorkload("c//Pod/ns/c", "c", 4))
	time.Sleep(300 * time.Millisecond)
	if w, _ := dumpUIDs(t, admin); !has(w, "c//Pod/ns/a") {
		t.Fatalf("state lost while istiod was down: %v", w)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "state to converge after reconnect", func() bool {
		w, _ := dumpUIDs(t, admin)
		return !has(w, "c//Pod/ns/a") && has(w, "c//Pod/ns/b") && has(w, "c//Pod/ns/c")
	})
}

// TestXDSTrafficSurvivesNACKAndRestart: with config only from xDS, traffic
// between two in-pod workloads keeps flowing while a malformed push is
// NACKed and while istiod is down and comes back.
func TestXDSTrafficSurvivesNACKAndRestart(t *testing.T) {
	// istiod runs inside the node namespace, where ztunnel can reach it.
	var srv *xdstest.Server
	n := newInpodNodeWith(t, "zxt", func(node *nstest.Node) []string {
		if err := node.Do(func() (err error) {
			srv, err = xdstest.Start(xdstest.Options{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		return []string{"XDS_ADDRESS=" + srv.URL()}
	})
	for _, p := range []struct {
		name string
		ip   netip.Addr
	}{{"cl", n.cl.IP}, {"sv", n.sv.IP}} {
		uid := "c//Pod/d/" + p.name
		srv.SetAddress(uid, &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
			Uid: uid, Name: p.name, Namespace: "d", ServiceAccount: p.name,
			Addresses: [][]byte{p.ip.AsSlice()}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		}}})
	}
	dst := netip.AddrPortFrom(n.sv.IP, 7100).String()
	roundTrip := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := n.cl.Dial(ctx, "tcp", dst)
		if err != nil {
			t.Fatalf("%s: dial: %v", what, err)
		}
		defer c.Close()
		c.Write([]byte("ping"))
		c.(*net.TCPConn).CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil || !strings.HasPrefix(string(b), "4 ") {
			t.Fatalf("%s: reply %q %v", what, b, err)
		}
	}
	// The first connections go through once xDS delivered both workloads
	// (before that, the destination is unknown and passes through in
	// plaintext, which the sink also answers): wait for the mTLS path.
	eventually(t, "xDS workloads to arrive", func() bool {
		return metricSum(scrape(t, n.node.NS), "ztunnel_xds_resources") >= 2
	})
	roundTrip("after first push")

	from := srv.RequestCount()
	srv.SetRaw(addressType, "c//Pod/d/garbage", []byte{0xff, 0xff, 0xff})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool { return r.NACK() }); err != nil {
		t.Fatalf("malformed bytes not NACKed: %v", err)
	}
	roundTrip("after NACK")

	srv.Stop()
	for i := 0; i < 5; i++ {
		roundTrip("while istiod is down")
		time.Sleep(100 * time.Millisecond)
	}
	srv.Remove(addressType, "c//Pod/d/garbage")
	if err := n.node.Do(srv.Restart); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reconnect after restart", func() bool {
		return strings.Contains(scrape(t, n.node.NS), "\nztunnel_xds_connected 1\n")
	})
	roundTrip("after restart")
	opened := metricSum(scrape(t, n.node.NS), "istio_tcp_connections_opened_total", `connection_security_policy="mutual_tls"`, `reporter="destination"`)
	if opened < 8 {
		t.Fatalf("only %v connections went over mTLS, want all 8", opened)
	}
}
