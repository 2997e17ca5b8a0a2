package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// TestFaultDenyPolicyFailsClosed: a DENY Authorization that ztunnel cannot
// fully read is pushed over xDS while real connections flow from cl to sv.
// It is NACKed and counted, and still enforced: a connection it would have
// covered is denied, one it would not have covered still passes, and
// removing the policy lets traffic through again (istio/istio#61126 is the
// upstream fail-open this guards against).
func TestFaultDenyPolicyFailsClosed(t *testing.T) {
	n, srv := newXDSInpodNode(t, "zfc")
	if err := n.sinkOnce("before"); err != nil {
		t.Fatalf("no policy: %v", err)
	}
	// An entry whose match kind this build does not know: a StringMatch
	// holding only field 99 (what a newer istiod's new kind looks like).
	unknownKind := &securitypb.StringMatch{}
	unknownKind.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "regex"))
	badCIDR := &securitypb.Address{Address: []byte{10, 0, 0}, Length: 24}
	denyWith := func(m *securitypb.Match) *securitypb.Authorization {
		return &securitypb.Authorization{Name: "deny", Namespace: "d", Scope: securitypb.Scope_NAMESPACE, Action: securitypb.Action_DENY,
			Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{m}}}}}}
	}
	cases := []struct {
		name   string
		m      *securitypb.Match
		nack   string // substring of the NACK; "" for an accepted policy
		denied bool
	}{
		{"bad source CIDR, port 7100", &securitypb.Match{SourceIps: []*securitypb.Address{badCIDR}, DestinationPorts: []uint32{7100}},
			"want 4 or 16 bytes, got 3", true},
		{"bad source CIDR, port 9999 (does not cover 7100)", &securitypb.Match{SourceIps: []*securitypb.Address{badCIDR}, DestinationPorts: []uint32{9999}},
			"want 4 or 16 bytes, got 3", false},
		{"prefix length 40, port 7100", &securitypb.Match{DestinationIps: []*securitypb.Address{{Address: n.sv.IP.AsSlice(), Length: 40}}, DestinationPorts: []uint32{7100}},
			"prefix length 40 exceeds 32 bits", true},
		{"unknown match kind in principals", &securitypb.Match{Principals: []*securitypb.StringMatch{unknownKind}}, "", true},
	}
	var attempted, denied int
	for _, tc := range cases {
		from := srv.RequestCount()
		srv.SetAuthorization("d/deny", denyWith(tc.m))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool { return r.NACK() || r.ACK() })
		cancel()
		if err != nil {
			t.Fatalf("%s: no ACK/NACK: %v", tc.name, err)
		}
		msg := r.Msg.GetErrorDetail().GetMessage()
		if tc.nack != "" && (!r.NACK() || !strings.Contains(msg, tc.nack) || !strings.Contains(msg, "d/deny")) {
			t.Errorf("%s: response %q, want a NACK naming d/deny and %q", tc.name, msg, tc.nack)
		}
		if tc.nack == "" && r.NACK() {
			t.Errorf("%s: NACK %q, want ACK (an unknown kind is not malformed)", tc.name, msg)
		}
		// The push applies before the (N)ACK is sent; each case checks a
		// fresh connection.
		err = n.sinkOnce("ping")
		attempted++
		if err != nil {
			denied++
		}
		if got := err != nil; got != tc.denied {
			t.Errorf("%s: denied = %v (%v), want %v", tc.name, got, err, tc.denied)
		}
	}
	rejected := metricSum(scrape(t, n.node.NS), "ztunnel_state_rejected_resources_total", `type="policy"`, `reason="enforced_fail_closed"`)
	if rejected < 3 {
		t.Errorf("ztunnel_state_rejected_resources_total{reason=enforced_fail_closed} = %v, want >= 3", rejected)
	}
	srv.Remove(authzType, "d/deny")
	eventually(t, "traffic after the policy is removed", func() bool { return n.sinkOnce("after") == nil })
	t.Logf("fault deny-fails-closed: policies=%d connections=%d denied=%d (want 3) rejected_counter=%v skipped_denies=0",
		len(cases), attempted, denied, rejected)
}
