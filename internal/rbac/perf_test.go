package rbac

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// realistic is a policy set shaped like a namespace with a strict-mTLS
// DENY, an IP/port DENY and two identity ALLOWs, the last one matching.
func realistic(tb testing.TB) []*Policy {
	tb.Helper()
	strict := single(deny, &securitypb.Match{NotPrincipals: strs(presence())})
	strict.Name = "strict"
	blockNets := single(deny, &securitypb.Match{SourceIps: addrs(tb, "192.168.0.0/16", "172.16.0.0/12", "2001:db8::/32"),
		NotDestinationPorts: []uint32{15021, 15020}})
	blockNets.Name = "block-nets"
	frontend := single(allow, &securitypb.Match{Principals: strs(exact("cluster.local/ns/web/sa/frontend"), suffix("/sa/gateway")),
		DestinationPorts: []uint32{8080, 9080}})
	frontend.Name = "frontend"
	sameNS := authz(allow,
		[][]*securitypb.Match{{{Namespaces: strs(exact("prod"), prefix("team-"))}}, {{DestinationPorts: []uint32{80, 443, 8080, 8443, 9090, 9091, 9092, 9093, 9094, 9095}}}},
		[][]*securitypb.Match{{{ServiceAccounts: []*securitypb.ServiceAccountMatch{sa("payments", "api")}}}})
	sameNS.Name = "same-ns"
	var out []*Policy
	for _, a := range []*securitypb.Authorization{strict, blockNets, frontend, sameNS} {
		out = append(out, mustCompile(tb, a))
	}
	return out
}

var benchConn = Conn{
	SrcIP: netip.MustParseAddr("10.0.3.7"), DstIP: netip.MustParseAddr("10.0.9.2"), DstPort: 8443,
	SrcIdentity: "spiffe://cluster.local/ns/team-a/sa/worker",
}

func TestEvaluateDoesNotAllocate(t *testing.T) {
	policies := realistic(t)
	cases := []struct {
		name string
		conn Conn
		want Reason
	}{
		{"allowed by last rule of last policy", benchConn, ReasonAllowMatched},
		{"denied plaintext", Conn{SrcIP: benchConn.SrcIP, DstIP: benchConn.DstIP, DstPort: 8443}, ReasonExplicitlyDenied},
		{"not allowed", Conn{SrcIP: benchConn.SrcIP, DstIP: benchConn.DstIP, DstPort: 1, SrcIdentity: "spiffe://cluster.local/ns/other/sa/x"}, ReasonNotAllowed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if d := Evaluate(policies, tc.conn); d.Reason != tc.want {
				t.Fatalf("Evaluate = %+v, want reason %s", d, tc.want)
			}
			if n := testing.AllocsPerRun(200, func() { Evaluate(policies, tc.conn) }); n != 0 {
				t.Errorf("Evaluate allocates %v times per call, want 0", n)
			}
		})
	}
}

func BenchmarkEvaluate(b *testing.B) {
	policies := realistic(b)
	b.Run("realistic-allowed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Evaluate(policies, benchConn)
		}
	})
	b.Run("no-policies", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Evaluate(nil, benchConn)
		}
	})
	// 200 CIDRs in one list, none matching: the linear-scan worst case.
	var many []string
	for i := range 200 {
		many = append(many, netip.AddrFrom4([4]byte{100, byte(i), 0, 0}).String()+"/16")
	}
	wide := []*Policy{mustCompile(b, single(deny, &securitypb.Match{SourceIps: addrs(b, many...)}))}
	b.Run("200-cidrs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Evaluate(wide, benchConn)
		}
	})
}

func BenchmarkCompile(b *testing.B) {
	a := authz(allow,
		[][]*securitypb.Match{{{Namespaces: strs(exact("prod"), prefix("team-"))}}, {{DestinationPorts: []uint32{80, 443, 8080}}}},
		[][]*securitypb.Match{{{SourceIps: addrs(b, "10.0.0.0/8", "2001:db8::/32")}}})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(a); err != nil {
			b.Fatal(err)
		}
	}
}
