package rbac

import (
	"reflect"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// TestFailClosed: what ztunnel cannot evaluate makes a DENY match more and
// an ALLOW match less, never the reverse. Each case is checked against the
// three reference connections: plaintext 127.0.0.1->127.0.0.2:8080, tls
// (ns "namespace") same addresses, tls_alt (ns "ns-alt") ->127.0.0.4:9090.
func TestFailClosed(t *testing.T) {
	type want struct{ plaintext, tls, alt bool }
	none, all := want{}, want{true, true, true}
	port8080 := []uint32{8080}
	cases := []struct {
		name  string
		a     *securitypb.Authorization
		want  want
		notes []string // exact Unevaluable(); nil: any non-empty list
		clean bool     // Unevaluable() must be empty
	}{
		// An L7-only rule reaches ztunnel as a Match with no conditions.
		{name: "DENY empty match denies all (upstream: denies nothing)",
			a: single(deny, &securitypb.Match{}), want: all,
			notes: []string{"rule 0 clause 0 match 0: no conditions (L7-only rule)"}},
		{name: "ALLOW empty match allows nothing",
			a: single(allow, &securitypb.Match{}), want: none,
			notes: []string{"rule 0 clause 0 match 0: no conditions (L7-only rule)"}},
		{name: "DENY empty match beside L4 match in clause",
			a: authz(deny, [][]*securitypb.Match{{{DestinationPorts: []uint32{1}}, {}}}), want: all},
		{name: "DENY L7-only clause AND L4 clause keeps L4 part",
			a: authz(deny, [][]*securitypb.Match{{{}}, {{DestinationPorts: port8080}}}), want: want{true, true, false}},
		{name: "DENY match with only extensions denies all",
			a: single(deny, &securitypb.Match{Extensions: ext()}), want: all,
			notes: []string{"rule 0 clause 0 match 0: extensions"}},
		{name: "ALLOW match with only extensions allows nothing",
			a: single(allow, &securitypb.Match{Extensions: ext()}), want: none},
		{name: "DENY extensions beside ports keeps ports",
			a: single(deny, &securitypb.Match{Extensions: ext(), DestinationPorts: port8080}), want: want{true, true, false}},
		{name: "ALLOW extensions beside ports never matches",
			a: single(allow, &securitypb.Match{Extensions: ext(), DestinationPorts: port8080}), want: none},
		{name: "DENY unknown match field beside namespaces keeps namespaces",
			a: single(deny, withUnknown(&securitypb.Match{Namespaces: strs(exact("namespace"))})), want: want{false, true, false},
			notes: []string{"rule 0 clause 0 match 0: unknown match fields"}},
		{name: "ALLOW unknown match field never matches",
			a: single(allow, withUnknown(&securitypb.Match{Namespaces: strs(exact("namespace"))})), want: none},

		// Unevaluable list entries.
		{name: "DENY namespaces entry without kind holds",
			a: single(deny, &securitypb.Match{Namespaces: strs(exact("other"), &securitypb.StringMatch{})}), want: all,
			notes: []string{"rule 0 clause 0 match 0: namespaces[1]: unsupported entry"}},
		{name: "DENY namespaces entry without kind holds, other fields still apply",
			a: single(deny, &securitypb.Match{Namespaces: strs(exact("other"), &securitypb.StringMatch{}), DestinationPorts: port8080}), want: want{true, true, false}},
		{name: "DENY not_namespaces entry without kind ignored",
			a: single(deny, &securitypb.Match{NotNamespaces: strs(&securitypb.StringMatch{}, exact("namespace"))}), want: want{true, false, true}},
		{name: "DENY not_namespaces only entry without kind ignored",
			a: single(deny, &securitypb.Match{NotNamespaces: strs(&securitypb.StringMatch{}), DestinationPorts: port8080}), want: want{true, true, false}},
		{name: "ALLOW namespaces entry without kind ignored",
			a: single(allow, &securitypb.Match{Namespaces: strs(&securitypb.StringMatch{}, exact("namespace"))}), want: want{false, true, false}},
		{name: "ALLOW namespaces only entry without kind never matches (upstream: any namespace)",
			a: single(allow, &securitypb.Match{Namespaces: strs(&securitypb.StringMatch{}), DestinationPorts: port8080}), want: none},
		{name: "ALLOW not_namespaces entry without kind never matches",
			a: single(allow, &securitypb.Match{NotNamespaces: strs(&securitypb.StringMatch{}, exact("namespace"))}), want: none},
		{name: "DENY principals with unknown kind holds",
			a: single(deny, &securitypb.Match{Principals: strs(withUnknown(&securitypb.StringMatch{}))}), want: all},
		{name: "DENY not_principals presence with unknown sibling field ignored",
			a: single(deny, &securitypb.Match{NotPrincipals: strs(presence(), withUnknown(&securitypb.StringMatch{}))}), want: want{true, false, false}},
		{name: "ALLOW principals with unknown field on known kind ignored",
			a: single(allow, &securitypb.Match{Principals: strs(withUnknown(presence()), exact("td/ns/namespace/sa/account"))}), want: want{false, true, false}},
		{name: "DENY source_ips address with unknown field holds",
			a: single(deny, &securitypb.Match{SourceIps: []*securitypb.Address{withUnknown(cidr(t, "10.0.0.0/8"))}}), want: all},
		{name: "ALLOW not_destination_ips address with unknown field never matches",
			a: single(allow, &securitypb.Match{NotDestinationIps: []*securitypb.Address{withUnknown(cidr(t, "10.0.0.0/8"))}}), want: none},
		{name: "ALLOW service_accounts with unknown field, list left empty, never matches",
			a: single(allow, &securitypb.Match{ServiceAccounts: []*securitypb.ServiceAccountMatch{withUnknown(sa("namespace", "account"))}}), want: none},
		{name: "DENY not_service_accounts with unknown field ignored",
			a: single(deny, &securitypb.Match{NotServiceAccounts: []*securitypb.ServiceAccountMatch{withUnknown(sa("namespace", "account"))}, DestinationPorts: []uint32{9090}}), want: want{false, false, true}},

		// Unknown fields on clauses and rules.
		{name: "DENY unknown clause field: clause holds",
			a: &securitypb.Authorization{Action: deny, Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{
				withUnknown(&securitypb.Clause{Matches: []*securitypb.Match{{DestinationPorts: []uint32{1}}}}),
				{Matches: []*securitypb.Match{{DestinationPorts: port8080}}}}}}},
			want:  want{true, true, false},
			notes: []string{"rule 0 clause 0: unknown clause fields"}},
		{name: "ALLOW unknown clause field: clause fails",
			a: &securitypb.Authorization{Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{
				withUnknown(&securitypb.Clause{}), {Matches: []*securitypb.Match{{DestinationPorts: port8080}}}}}}},
			want: none},
		{name: "DENY unknown rule field: rule holds",
			a: &securitypb.Authorization{Action: deny, Rules: []*securitypb.Rule{
				withUnknown(&securitypb.Rule{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{{DestinationPorts: []uint32{1}}}}}})}},
			want: all, notes: []string{"rule 0: unknown rule fields"}},
		{name: "ALLOW unknown rule field: rule fails, other rules still apply",
			a: &securitypb.Authorization{Rules: []*securitypb.Rule{withUnknown(&securitypb.Rule{}),
				{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{{DestinationPorts: []uint32{9090}}}}}}}},
			want: want{false, false, true}},

		// Not conditions: ignored, as upstream.
		{name: "Authorization extensions ignored",
			a: func() *securitypb.Authorization {
				a := single(deny, &securitypb.Match{DestinationPorts: []uint32{9090}})
				a.Extensions = ext()
				return withUnknown(a)
			}(),
			want: want{false, false, true}, clean: true},
	}
	conns := []Conn{plaintextConn, tlsConn, tlsConnAlt}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, tc.a)
			want := []bool{tc.want.plaintext, tc.want.tls, tc.want.alt}
			for i, name := range []string{"plaintext", "tls", "tls_alt"} {
				if got := policyMatches(p, conns[i]); got != want[i] {
					t.Errorf("%s: matches = %v, want %v", name, got, want[i])
				}
			}
			switch u := p.Unevaluable(); {
			case tc.clean && len(u) != 0:
				t.Errorf("Unevaluable() = %q, want none", u)
			case tc.notes != nil && !reflect.DeepEqual(u, tc.notes):
				t.Errorf("Unevaluable() = %q, want %q", u, tc.notes)
			case !tc.clean && len(u) == 0:
				t.Errorf("Unevaluable() is empty; every fail-closed resolution must be reported")
			}
		})
	}
}

// TestFailClosedDecision: an L7-only DENY next to a matching ALLOW denies.
func TestFailClosedDecision(t *testing.T) {
	l7Deny := mustCompile(t, single(deny, &securitypb.Match{}))
	a := authz(allow, [][]*securitypb.Match{})
	a.Name = "all"
	allowAll := mustCompile(t, a)
	got := Evaluate([]*Policy{allowAll, l7Deny}, tlsConn)
	want := Decision{Policy: "ns/name", Reason: ReasonExplicitlyDenied}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Evaluate = %+v, want %+v", got, want)
	}
}
