package rbac

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The three connections upstream's rbac tests use.
var (
	plaintextConn = Conn{
		SrcIP: netip.MustParseAddr("127.0.0.1"), DstIP: netip.MustParseAddr("127.0.0.2"), DstPort: 8080,
	}
	tlsConn = Conn{
		SrcIP: netip.MustParseAddr("127.0.0.1"), DstIP: netip.MustParseAddr("127.0.0.2"), DstPort: 8080,
		SrcIdentity: "spiffe://td/ns/namespace/sa/account",
	}
	tlsConnAlt = Conn{
		SrcIP: netip.MustParseAddr("127.0.0.3"), DstIP: netip.MustParseAddr("127.0.0.4"), DstPort: 9090,
		SrcIdentity: "spiffe://td-alt/ns/ns-alt/sa/sa=alt",
	}
)

func exact(s string) *securitypb.StringMatch {
	return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Exact{Exact: s}}
}

func prefix(s string) *securitypb.StringMatch {
	return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Prefix{Prefix: s}}
}

func suffix(s string) *securitypb.StringMatch {
	return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Suffix{Suffix: s}}
}

func presence() *securitypb.StringMatch {
	return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}
}

func strs(l ...*securitypb.StringMatch) []*securitypb.StringMatch { return l }

func sa(ns, name string) *securitypb.ServiceAccountMatch {
	return &securitypb.ServiceAccountMatch{Namespace: ns, ServiceAccount: name}
}

// cidr builds an Address from "ip/len" with the address in its natural
// size (4 bytes for IPv4, 16 for IPv6 including v4-mapped).
func cidr(t testing.TB, s string) *securitypb.Address {
	t.Helper()
	p := netip.MustParsePrefix(s)
	return &securitypb.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())}
}

func addrs(t testing.TB, l ...string) []*securitypb.Address {
	out := make([]*securitypb.Address, len(l))
	for i, s := range l {
		out[i] = cidr(t, s)
	}
	return out
}

// withUnknown returns m with an unknown field (number 99) attached, as a
// newer istiod's field would arrive.
func withUnknown[M proto.Message](m M) M {
	raw := protowire.AppendTag(nil, 99, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 1)
	m.ProtoReflect().SetUnknown(raw)
	return m
}

func ext() []*workloadpb.Extension { return []*workloadpb.Extension{{Name: "l7"}} }

// authz builds a policy "ns/name" with one rule per element of rules; each
// rule is a list of clauses, each clause a list of matches.
func authz(action securitypb.Action, rules ...[][]*securitypb.Match) *securitypb.Authorization {
	a := &securitypb.Authorization{Name: "name", Namespace: "ns", Action: action}
	for _, r := range rules {
		pr := &securitypb.Rule{}
		for _, c := range r {
			pr.Clauses = append(pr.Clauses, &securitypb.Clause{Matches: c})
		}
		a.Rules = append(a.Rules, pr)
	}
	return a
}

// single is a policy of one rule, one clause, one match.
func single(action securitypb.Action, m *securitypb.Match) *securitypb.Authorization {
	return authz(action, [][]*securitypb.Match{{m}})
}

func mustCompile(t testing.TB, a *securitypb.Authorization) *Policy {
	t.Helper()
	p, err := Compile(a)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return p
}

func policyMatches(p *Policy, c Conn) bool {
	a := newAttrs(c)
	return p.matches(&a)
}
