package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// TestFaultBadInput sends bad input to every port and socket of one running
// ztunnel (in-pod mode, config from xDS): the data-path listeners 15001,
// 15006 and 15008, the ZDS socket, and xDS resources of each type. Each row
// must get a clear error (closed connection, error Ack, NACK naming the
// resource), move its counter by one, keep the last good state (cl→sv still
// works over mTLS) and not crash the process. Admin bad input is
// TestFaultAdminBadInput in internal/admin.
func TestFaultBadInput(t *testing.T) {
	n, srv := newXDSInpodNode(t, "zbi")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	devnull, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	pod, err := n.node.AddPod("extra")
	if err != nil {
		t.Fatal(err)
	}
	nsf, err := os.Open(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nsf.Close()

	// closedOn writes garbage to addr from ns and wants the connection
	// closed by ztunnel with no reply but, at most, a TLS alert.
	closedOn := func(ns *nstest.NS, addr string, garbage []byte) func() error {
		return func() error {
			c, err := ns.Dial(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(12 * time.Second))
			c.Write(garbage)
			b, err := io.ReadAll(c)
			if len(b) > 0 && b[0] != 0x15 { // 0x15: a TLS alert record is a clear refusal
				return fmt.Errorf("got %d bytes of reply %q (%v), want a close or a TLS alert", len(b), b, err)
			}
			return nil
		}
	}
	tlsOn := func(addr string, cfg *tls.Config) func() error {
		return func() error {
			c, err := n.node.NS.Dial(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			tc := tls.Client(c, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				return nil // refused during the handshake
			}
			// TLS 1.3: a missing client cert is refused after the client's
			// Finished; the first read sees it.
			if _, err := tc.Read(make([]byte, 1)); err == nil {
				return fmt.Errorf("handshake without a client certificate was served")
			}
			return nil
		}
	}
	zds := func(data []byte, reason inpod.Reason, fds ...int) func() error {
		return func() error {
			resp, err := n.cni.SendRaw(ctx, data, fds...)
			if err != nil {
				return err
			}
			if got := resp.GetAck().GetError(); !strings.HasPrefix(got, "inpod: "+string(reason)) {
				return fmt.Errorf("ack error %q, want reason %s", got, reason)
			}
			return nil
		}
	}
	xdsPush := func(typeURL, name string, value []byte, want string) func() error {
		return func() error {
			from := srv.RequestCount()
			srv.SetRaw(typeURL, name, value)
			defer srv.Remove(typeURL, name)
			r, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool { return r.NACK() || r.ACK() })
			if err != nil {
				return err
			}
			if msg := r.Msg.GetErrorDetail().GetMessage(); !r.NACK() || !strings.Contains(msg, name) || !strings.Contains(msg, want) {
				return fmt.Errorf("response %q (NACK %v), want a NACK naming %s and %q", msg, r.NACK(), name, want)
			}
			return nil
		}
	}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	add := marshal(&zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: "uid-bad", WorkloadInfo: &zdspb.WorkloadInfo{Name: "bad", Namespace: "d"}}}})
	wl := func(uid string, ip []byte) []byte {
		return marshal(&workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
			Uid: uid, Name: "bad", Namespace: "d", Addresses: [][]byte{ip}}}})
	}
	svc := marshal(&workloadpb.Address{Type: &workloadpb.Address_Service{Service: &workloadpb.Service{
		Name: "s", Namespace: "d", Hostname: "s.d.svc", Ports: []*workloadpb.Port{{ServicePort: 70000, TargetPort: 80}}}}})
	pol := marshal(&securitypb.Authorization{Name: "p", Namespace: "d", Action: 7})

	sv15008 := netip.AddrPortFrom(n.sv.IP, 15008).String()
	rejected := func(dir, reason string) []string {
		return []string{"istio_ztunnel_connection_rejected_total", `direction="` + dir + `"`, `reason="` + reason + `"`}
	}
	hboneReject := []string{"ztunnel_hbone_server_rejects_total", `reason="tls_handshake"`}
	zdsErr := func(r inpod.Reason) []string {
		return []string{"istio_workload_manager_zds_errors_total", `reason="` + string(r) + `"`}
	}
	stateRej := func(typ, reason string) []string {
		return []string{"ztunnel_state_rejected_resources_total", `type="` + typ + `"`, `reason="` + reason + `"`}
	}
	const nackMetric = "ztunnel_xds_nacks_total"
	rows := []struct {
		port, input string
		do          func() error
		counter     []string // metric name, then label pairs
	}{
		{"15001", "direct connect to 15001 (loop)", closedOn(n.cl.NS, "127.0.0.1:15001", []byte("GET / HTTP/1.1\r\n\r\n")), rejected("outbound", "loop")},
		{"15006", "connect to 15006 itself (redirect loop)", closedOn(n.node.NS, netip.AddrPortFrom(n.sv.IP, 15006).String(), []byte("hello")), rejected("inbound", "loop")},
		{"15008", "plaintext garbage", closedOn(n.node.NS, sv15008, []byte("\x16\x03\x01\xff\xffgarbage-not-tls")), hboneReject},
		{"15008", "HTTP/1.1 instead of TLS", closedOn(n.node.NS, sv15008, []byte("CONNECT 1.2.3.4:80 HTTP/1.1\r\n\r\n")), hboneReject},
		{"15008", "TLS without client certificate", tlsOn(sv15008, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}), hboneReject},
		{"15008", "TLS 1.2 only", tlsOn(sv15008, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}), hboneReject},
		{"ZDS", "short packet (3 bytes garbage)", zds([]byte{0xff, 0x01, 0x02}, inpod.ReasonDecode), zdsErr(inpod.ReasonDecode)},
		{"ZDS", "oversized packet (2 KiB)", zds(make([]byte, 2*inpod.MaxMessageSize), inpod.ReasonTruncated), zdsErr(inpod.ReasonTruncated)},
		{"ZDS", "add with two fds", zds(add, inpod.ReasonTooManyFDs, int(nsf.Fd()), int(nsf.Fd())), zdsErr(inpod.ReasonTooManyFDs)},
		{"ZDS", "add with no fd", zds(add, inpod.ReasonMissingFD), zdsErr(inpod.ReasonMissingFD)},
		{"ZDS", "add with a non-netns fd", zds(add, inpod.ReasonNotNetns, int(devnull.Fd())), zdsErr(inpod.ReasonNotNetns)},
		{"ZDS", "unknown message (field 9)", zds([]byte{0x48, 0x01}, inpod.ReasonUnknownPayload), zdsErr(inpod.ReasonUnknownPayload)},
		{"xDS", "Address: not a protobuf", xdsPush(addressType, "c//Pod/d/junk", []byte{0xff, 0xff, 0xff}, "c//Pod/d/junk"), []string{nackMetric, "Address"}},
		{"xDS", "Address: workload with a 3-byte IP", xdsPush(addressType, "c//Pod/d/bad", wl("c//Pod/d/bad", []byte{10, 0, 0}), "want 4 or 16 bytes"), stateRej("workload", "bad_address")},
		{"xDS", "Address: workload named by another uid", xdsPush(addressType, "c//Pod/d/other", wl("c//Pod/d/bad", []byte{10, 0, 0, 9}), "name mismatch"), stateRej("workload", "name_mismatch")},
		{"xDS", "Address: service port 70000", xdsPush(addressType, "d/s.d.svc", svc, "port"), stateRej("service", "bad_port")},
		{"xDS", "Authorization: not a protobuf", xdsPush(authzType, "d/junk", []byte{0x0a, 0xff}, "d/junk"), []string{nackMetric, "Authorization"}},
		{"xDS", "Authorization: unknown action 7", xdsPush(authzType, "d/p", pol, "unknown enum action 7"), stateRej("policy", "unknown_enum")},
	}
	for _, r := range rows {
		before := metricSum(scrape(t, n.node.NS), r.counter[0], r.counter[1:]...)
		if err := r.do(); err != nil {
			t.Errorf("%s %s: %v", r.port, r.input, err)
		}
		var after float64
		deadline := time.Now().Add(5 * time.Second)
		for {
			text := scrape(t, n.node.NS)
			if after = metricSum(text, r.counter[0], r.counter[1:]...); after > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s: %s%v did not move from %v:\n%s", r.port, r.input, r.counter[0], r.counter[1:], before, grepLines(text, r.counter[0]))
			}
			time.Sleep(50 * time.Millisecond)
		}
		select {
		case err := <-n.exited:
			t.Fatalf("%s %s: ztunnel exited: %v\n%s", r.port, r.input, err, readFile(n.logPath))
		default:
		}
		if err := n.sinkOnce("still-good"); err != nil {
			t.Errorf("%s %s: last good state lost: cl→sv: %v", r.port, r.input, err)
		}
		t.Logf("fault bad-input: %-5s %-42s %s %v→%v, cl→sv ok, process up", r.port, r.input, r.counter[0], before, after)
	}
	mtls := metricSum(scrape(t, n.node.NS), "istio_tcp_connections_opened_total", `connection_security_policy="mutual_tls"`, `reporter="destination"`)
	if mtls < float64(len(rows)) {
		t.Errorf("only %v connections went over mTLS, want >= %d: the good state was not kept", mtls, len(rows))
	}
	t.Logf("fault bad-input: rows=%d crashes=0 good_roundtrips=%d", len(rows), len(rows))
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
