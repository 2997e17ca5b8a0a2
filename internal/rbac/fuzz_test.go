package rbac

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"google.golang.org/protobuf/proto"
)

// FuzzEvaluate feeds arbitrary bytes through proto.Unmarshal, Compile and
// Evaluate with a fuzzed connection; nothing may panic, and a compiled
// policy's decision must be consistent with its action.
func FuzzEvaluate(f *testing.F) {
	seeds := []*securitypb.Authorization{
		single(deny, &securitypb.Match{NotPrincipals: strs(presence())}),
		single(allow, &securitypb.Match{SourceIps: addrs(f, "10.0.0.0/8", "::/0"), DestinationPorts: []uint32{80, 443}}),
		single(deny, &securitypb.Match{Extensions: ext()}),
		authz(allow, [][]*securitypb.Match{{{Namespaces: strs(prefix("a"), &securitypb.StringMatch{})}}, {}}),
		{Name: "n", Namespace: "s", Scope: securitypb.Scope_WORKLOAD_SELECTOR, DryRun: true,
			Rules: []*securitypb.Rule{withUnknown(&securitypb.Rule{})}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte{10, 1, 2, 3}, []byte{10, 0, 0, 1}, uint16(80), "spiffe://cluster.local/ns/a/sa/b")
	}
	f.Add([]byte{0x2a, 0x03, 0x0a, 0x01, 0x12}, []byte{}, make([]byte, 16), uint16(0), "")
	// Malformed entries: a 3-byte CIDR in a DENY, a port above 65535 in an ALLOW.
	for _, s := range []*securitypb.Authorization{
		single(deny, &securitypb.Match{SourceIps: []*securitypb.Address{{Address: []byte{10, 0, 0}, Length: 8}}}),
		single(allow, &securitypb.Match{DestinationPorts: []uint32{70000, 80}}),
	} {
		b, _ := proto.Marshal(s)
		f.Add(b, []byte{10, 0, 0, 1}, []byte{10, 0, 0, 2}, uint16(80), "")
	}
	f.Fuzz(func(t *testing.T, data, src, dst []byte, port uint16, id string) {
		var a securitypb.Authorization
		if err := proto.Unmarshal(data, &a); err != nil {
			return
		}
		p, err := Compile(&a)
		if err != nil {
			// A malformed resource yields no policy; a malformed entry
			// yields the fail-closed one, which is evaluated below.
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("Compile error %v is not a *CompileError", err)
			}
			whole := ce.Reason == ReasonNilPolicy || ce.Reason == ReasonUnknownScope || ce.Reason == ReasonUnknownAction
			if whole != (p == nil) {
				t.Fatalf("Compile returned policy %v with %v", p != nil, err)
			}
			if p == nil {
				return
			}
			if len(p.Unevaluable()) == 0 {
				t.Fatalf("fail-closed policy for %v lists nothing unevaluable", err)
			}
		}
		srcIP, _ := netip.AddrFromSlice(src)
		dstIP, _ := netip.AddrFromSlice(dst)
		c := Conn{SrcIP: srcIP, DstIP: dstIP, DstPort: port, SrcIdentity: id}
		d := Evaluate([]*Policy{p}, c)
		_ = p.Unevaluable()
		_ = d.String()
		switch {
		case p.DryRun && !d.Allowed:
			t.Fatalf("dry-run policy denied: %+v", d)
		case !p.DryRun && p.Action == Deny && d.Allowed && d.Reason != ReasonNoAllowPolicies:
			t.Fatalf("lone DENY allowed with reason %s", d.Reason)
		case !p.DryRun && p.Action == Allow && d.Reason == ReasonNoAllowPolicies:
			t.Fatalf("lone ALLOW reported as absent")
		}
	})
}
