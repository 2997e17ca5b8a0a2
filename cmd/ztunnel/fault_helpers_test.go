package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// newXDSInpodNode is newInpodNode with config only from an xDS server that
// runs inside the node namespace (as TestXDSTrafficSurvivesNACKAndRestart),
// serving cl and sv; it returns once ztunnel holds both workloads.
func newXDSInpodNode(t *testing.T, prefix string, env ...string) (*inpodNode, *xdstest.Server) {
	t.Helper()
	var srv *xdstest.Server
	n := newInpodNodeWith(t, prefix, func(node *nstest.Node) []string {
		if err := node.Do(func() (err error) {
			srv, err = xdstest.Start(xdstest.Options{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		return []string{"XDS_ADDRESS=" + srv.URL()}
	}, env...)
	for _, p := range []*nstest.Pod{n.cl, n.sv} {
		name := strings.TrimPrefix(p.Name, prefix+"-")
		uid := "c//Pod/d/" + name
		srv.SetAddress(uid, &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
			Uid: uid, Name: name, Namespace: "d", ServiceAccount: name,
			Addresses: [][]byte{p.IP.AsSlice()}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		}}})
	}
	eventually(t, "xDS workloads to arrive", func() bool {
		return metricSum(scrape(t, n.node.NS), "ztunnel_xds_resources") >= 2
	})
	return n, srv
}

// enroll hands pod p to ztunnel through the CNI emulator (ZDS add with the
// pod's netns FD), as workload namespace d / name with service account sa.
func (n *inpodNode) enroll(ctx context.Context, p *nstest.Pod, uid, name, sa string) error {
	f, err := os.Open(p.Path())
	if err != nil {
		return err
	}
	defer f.Close()
	return n.cni.AddPod(ctx, uid, &zdspb.WorkloadInfo{Name: name, Namespace: "d", ServiceAccount: sa}, f)
}

// sinkOnce sends msg from cl to the sink on sv:7100 and checks the reply
// ("<len> <sha256>"); an error means the connection was refused, reset or
// answered wrongly.
func (n *inpodNode) sinkOnce(msg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := n.cl.Dial(ctx, "tcp", netip.AddrPortFrom(n.sv.IP, 7100).String())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	c.(*net.TCPConn).CloseWrite()
	b := make([]byte, 128)
	k, err := c.Read(b)
	if want := fmt.Sprintf("%d ", len(msg)); err != nil || !strings.HasPrefix(string(b[:k]), want) {
		return fmt.Errorf("reply %q: %v", b[:k], err)
	}
	return nil
}
