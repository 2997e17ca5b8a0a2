package rbac

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

const (
	allow = securitypb.Action_ALLOW
	deny  = securitypb.Action_DENY
)

// TestMatchFields checks every Match field and its not_ form against the
// three reference connections, for both actions (a fully L4 Match matches
// the same way in ALLOW and DENY).
func TestMatchFields(t *testing.T) {
	type want struct{ plaintext, tls, alt bool }
	cases := []struct {
		name string
		m    *securitypb.Match
		want want
	}{
		{"namespaces", &securitypb.Match{Namespaces: strs(exact("namespace"))}, want{false, true, false}},
		{"not_namespaces", &securitypb.Match{NotNamespaces: strs(exact("namespace"))}, want{true, false, true}},
		{"service_accounts", &securitypb.Match{ServiceAccounts: []*securitypb.ServiceAccountMatch{sa("namespace", "account")}}, want{false, true, false}},
		{"not_service_accounts", &securitypb.Match{NotServiceAccounts: []*securitypb.ServiceAccountMatch{sa("namespace", "account")}}, want{true, false, true}},
		{"service_accounts trust domain ignored", &securitypb.Match{ServiceAccounts: []*securitypb.ServiceAccountMatch{sa("ns-alt", "sa=alt")}}, want{false, false, true}},
		{"service_accounts needs both", &securitypb.Match{ServiceAccounts: []*securitypb.ServiceAccountMatch{sa("namespace", "sa=alt")}}, want{false, false, false}},
		{"principals", &securitypb.Match{Principals: strs(exact("td/ns/namespace/sa/account"))}, want{false, true, false}},
		{"not_principals", &securitypb.Match{NotPrincipals: strs(exact("td/ns/namespace/sa/account"))}, want{true, false, true}},
		{"principals compared without spiffe scheme", &securitypb.Match{Principals: strs(exact("spiffe://td/ns/namespace/sa/account"))}, want{false, false, false}},
		{"principals presence", &securitypb.Match{Principals: strs(presence())}, want{false, true, true}},
		{"not_principals presence (strict mTLS)", &securitypb.Match{NotPrincipals: strs(presence())}, want{true, false, false}},
		{"principals empty prefix needs identity", &securitypb.Match{Principals: strs(prefix(""))}, want{false, true, true}},
		{"namespaces exact empty matches plaintext", &securitypb.Match{Namespaces: strs(exact(""))}, want{true, false, false}},
		{"source_ips", &securitypb.Match{SourceIps: addrs(t, "127.0.0.1/32")}, want{true, true, false}},
		{"not_source_ips", &securitypb.Match{NotSourceIps: addrs(t, "127.0.0.1/32")}, want{false, false, true}},
		{"destination_ips", &securitypb.Match{DestinationIps: addrs(t, "127.0.0.2/32")}, want{true, true, false}},
		{"not_destination_ips", &securitypb.Match{NotDestinationIps: addrs(t, "127.0.0.2/32")}, want{false, false, true}},
		{"destination_ips cidr range", &securitypb.Match{DestinationIps: addrs(t, "127.0.0.1/24")}, want{true, true, true}},
		{"destination_ports", &securitypb.Match{DestinationPorts: []uint32{8080}}, want{true, true, false}},
		{"not_destination_ports", &securitypb.Match{NotDestinationPorts: []uint32{8080}}, want{false, false, true}},
		{"fields AND'ed", &securitypb.Match{Namespaces: strs(exact("namespace")), DestinationPorts: []uint32{9090}}, want{false, false, false}},
		{"entries OR'ed", &securitypb.Match{Namespaces: strs(exact("namespace"), exact("ns-alt"))}, want{false, true, true}},
		{"positive and negative of one field", &securitypb.Match{DestinationIps: addrs(t, "127.0.0.0/8"), NotDestinationIps: addrs(t, "127.0.0.4/32")}, want{true, true, false}},
	}
	conns := []struct {
		name string
		c    Conn
	}{{"plaintext", plaintextConn}, {"tls", tlsConn}, {"tls_alt", tlsConnAlt}}
	for _, tc := range cases {
		for _, action := range []securitypb.Action{allow, deny} {
			t.Run(tc.name+"/"+action.String(), func(t *testing.T) {
				p := mustCompile(t, single(action, tc.m))
				if u := p.Unevaluable(); len(u) != 0 {
					t.Fatalf("Unevaluable() = %q, want none", u)
				}
				want := []bool{tc.want.plaintext, tc.want.tls, tc.want.alt}
				for i, c := range conns {
					if got := policyMatches(p, c.c); got != want[i] {
						t.Errorf("%s: matches = %v, want %v", c.name, got, want[i])
					}
				}
			})
		}
	}
}

// TestStringMatchKinds is upstream's string_match table.
func TestStringMatchKinds(t *testing.T) {
	cases := []struct {
		name string
		m    strMatch
		s    string
		want bool
	}{
		{"exact match", strMatch{strExact, "foo"}, "foo", true},
		{"exact mismatch", strMatch{strExact, "foo"}, "not", false},
		{"exact empty mismatch", strMatch{strExact, "foo"}, "", false},
		{"prefix match", strMatch{strPrefix, "foo"}, "foobar", true},
		{"prefix mismatch", strMatch{strPrefix, "foo"}, "notfoo", false},
		{"prefix empty mismatch", strMatch{strPrefix, "foo"}, "", false},
		{"suffix match", strMatch{strSuffix, "foo"}, "barfoo", true},
		{"suffix mismatch", strMatch{strSuffix, "foo"}, "foonot", false},
		{"suffix empty mismatch", strMatch{strSuffix, "foo"}, "", false},
		{"presence match", strMatch{strPresence, ""}, "foo", true},
		{"presence mismatch", strMatch{strPresence, ""}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.m.matches(tc.s); got != tc.want {
				t.Errorf("matches(%q) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}

// TestStringMatchKindsCompiled checks each kind end to end, on namespaces
// and on principals.
func TestStringMatchKindsCompiled(t *testing.T) {
	cases := []struct {
		name string
		m    *securitypb.Match
		tls  bool // spiffe://td/ns/namespace/sa/account
		alt  bool // spiffe://td-alt/ns/ns-alt/sa/sa=alt
	}{
		{"namespaces exact", &securitypb.Match{Namespaces: strs(exact("ns-alt"))}, false, true},
		{"namespaces prefix", &securitypb.Match{Namespaces: strs(prefix("name"))}, true, false},
		{"namespaces suffix", &securitypb.Match{Namespaces: strs(suffix("-alt"))}, false, true},
		{"namespaces presence", &securitypb.Match{Namespaces: strs(presence())}, true, true},
		{"principals exact", &securitypb.Match{Principals: strs(exact("td-alt/ns/ns-alt/sa/sa=alt"))}, false, true},
		{"principals prefix", &securitypb.Match{Principals: strs(prefix("td/"))}, true, false},
		{"principals suffix", &securitypb.Match{Principals: strs(suffix("/sa/account"))}, true, false},
		{"principals presence", &securitypb.Match{Principals: strs(presence())}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, single(allow, tc.m))
			if got := policyMatches(p, tlsConn); got != tc.tls {
				t.Errorf("tls: matches = %v, want %v", got, tc.tls)
			}
			if got := policyMatches(p, tlsConnAlt); got != tc.alt {
				t.Errorf("tls_alt: matches = %v, want %v", got, tc.alt)
			}
			if policyMatches(p, plaintextConn) {
				t.Errorf("plaintext: matches = true, want false")
			}
		})
	}
}

func TestIPMatching(t *testing.T) {
	cases := []struct {
		name  string
		match string // a destination_ips CIDR
		raw   *securitypb.Address
		dst   string
		want  bool
	}{
		{name: "v4 host", match: "10.1.2.3/32", dst: "10.1.2.3", want: true},
		{name: "v4 host other", match: "10.1.2.3/32", dst: "10.1.2.4", want: false},
		{name: "v4 host bits ignored", match: "10.1.2.3/8", dst: "10.200.0.1", want: true},
		{name: "v4 zero length is whole family", raw: &securitypb.Address{Address: []byte{10, 0, 0, 1}, Length: 0}, dst: "192.168.0.1", want: true},
		{name: "v4 zero length excludes v6", raw: &securitypb.Address{Address: []byte{10, 0, 0, 1}, Length: 0}, dst: "2001:db8::1", want: false},
		{name: "v6 prefix", match: "2001:db8::/32", dst: "2001:db8:1::5", want: true},
		{name: "v6 prefix other", match: "2001:db8::/32", dst: "2001:db9::5", want: false},
		{name: "v6 prefix excludes v4", match: "::/0", dst: "10.0.0.1", want: false},
		{name: "v4-mapped conn is unmapped", match: "10.0.0.0/8", dst: "::ffff:10.0.0.1", want: true},
		{name: "v4-mapped cidr stays v6", match: "::ffff:10.0.0.0/104", dst: "10.0.0.1", want: false},
		{name: "zone dropped", match: "fe80::/10", dst: "fe80::1%eth0", want: true},
		{name: "invalid conn address", match: "0.0.0.0/0", dst: "", want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.raw
			if a == nil {
				a = cidr(t, tc.match)
			}
			p := mustCompile(t, single(allow, &securitypb.Match{DestinationIps: []*securitypb.Address{a}}))
			var dst netip.Addr
			if tc.dst != "" {
				dst = netip.MustParseAddr(tc.dst)
			}
			if got := policyMatches(p, Conn{DstIP: dst}); got != tc.want {
				t.Errorf("matches = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPortLists(t *testing.T) {
	long := []uint32{9000, 1, 22, 443, 80, 8080, 3306, 5432, 6379, 27017, 80, 11211}
	cases := []struct {
		name  string
		ports []uint32
		port  uint16
		want  bool
	}{
		{"short hit", []uint32{80, 443}, 443, true},
		{"short miss", []uint32{80, 443}, 8443, false},
		{"port zero", []uint32{0}, 0, true},
		{"long hit first", long, 9000, true},
		{"long hit last", long, 11211, true},
		{"long hit duplicate", long, 80, true},
		{"long miss", long, 8443, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pos := mustCompile(t, single(allow, &securitypb.Match{DestinationPorts: tc.ports}))
			neg := mustCompile(t, single(allow, &securitypb.Match{NotDestinationPorts: tc.ports}))
			c := Conn{DstPort: tc.port}
			if got := policyMatches(pos, c); got != tc.want {
				t.Errorf("destination_ports: matches = %v, want %v", got, tc.want)
			}
			if got := policyMatches(neg, c); got != !tc.want {
				t.Errorf("not_destination_ports: matches = %v, want %v", got, !tc.want)
			}
		})
	}
}

func TestParseIdentity(t *testing.T) {
	cases := []struct {
		name              string
		in                string
		ok                bool
		principal, ns, sa string
	}{
		{name: "istio form", in: "spiffe://cluster.local/ns/default/sa/bookinfo", ok: true,
			principal: "cluster.local/ns/default/sa/bookinfo", ns: "default", sa: "bookinfo"},
		{name: "empty parts allowed", in: "spiffe:///ns//sa/", ok: true, principal: "/ns//sa/"},
		{name: "empty", in: ""},
		{name: "no scheme", in: "cluster.local/ns/default/sa/x"},
		{name: "other scheme", in: "https://cluster.local/ns/default/sa/x"},
		{name: "extra segment", in: "spiffe://td/ns/default/sa/x/y"},
		{name: "missing segment", in: "spiffe://td/ns/default/sa"},
		{name: "wrong ns key", in: "spiffe://td/namespace/default/sa/x"},
		{name: "wrong sa key", in: "spiffe://td/ns/default/serviceaccount/x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, ns, sa, ok := parseIdentity(tc.in)
			if ok != tc.ok || p != tc.principal || ns != tc.ns || sa != tc.sa {
				t.Errorf("parseIdentity(%q) = %q, %q, %q, %v; want %q, %q, %q, %v",
					tc.in, p, ns, sa, ok, tc.principal, tc.ns, tc.sa, tc.ok)
			}
		})
	}
}

// TestMalformedIdentityIsPlaintext: an identity not of Istio's form is no
// identity, so identity matches fail and not_ forms hold.
func TestMalformedIdentityIsPlaintext(t *testing.T) {
	c := Conn{SrcIdentity: "spiffe://td/workload/x"}
	for _, tc := range []struct {
		name string
		m    *securitypb.Match
		want bool
	}{
		{"principals presence", &securitypb.Match{Principals: strs(presence())}, false},
		{"not_principals presence", &securitypb.Match{NotPrincipals: strs(presence())}, true},
		{"namespaces exact empty", &securitypb.Match{Namespaces: strs(exact(""))}, true},
		{"not_service_accounts", &securitypb.Match{NotServiceAccounts: []*securitypb.ServiceAccountMatch{sa("", "")}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := policyMatches(mustCompile(t, single(allow, tc.m)), c); got != tc.want {
				t.Errorf("matches = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStructure covers the OR/AND nesting and upstream's empty-level rules
// (rbac_nesting, rbac_multi_rule, rbac_empty_policy for ALLOW).
func TestStructure(t *testing.T) {
	nsA := &securitypb.Match{Namespaces: strs(exact("namespace"))}
	nsB := &securitypb.Match{Namespaces: strs(exact("ns-alt"))}
	port8080 := &securitypb.Match{DestinationPorts: []uint32{8080}}
	cases := []struct {
		name      string
		a         *securitypb.Authorization
		tls, alt  bool
		plaintext bool
	}{
		{"no rules matches nothing", authz(allow), false, false, false},
		{"rule without clauses matches all", authz(allow, [][]*securitypb.Match{}), true, true, true},
		{"clause without matches matches all", authz(allow, [][]*securitypb.Match{{}}), true, true, true},
		{"empty match matches nothing (ALLOW)", single(allow, &securitypb.Match{}), false, false, false},
		{"matches in a clause OR'ed", authz(allow, [][]*securitypb.Match{{nsA, nsB}}), true, true, false},
		{"clauses AND'ed", authz(allow, [][]*securitypb.Match{{nsA, nsB}, {port8080}}), true, false, false},
		{"rules OR'ed", authz(allow, [][]*securitypb.Match{{nsA}}, [][]*securitypb.Match{{nsB}}), true, true, false},
		{"empty clause AND real clause", authz(allow, [][]*securitypb.Match{{}, {nsB}}), false, true, false},
		{"rule with no rules beside a real one", authz(allow, [][]*securitypb.Match{{nsA}}, [][]*securitypb.Match{}), true, true, true},
		{"nil rule clause match entries", &securitypb.Authorization{Rules: []*securitypb.Rule{nil, {Clauses: []*securitypb.Clause{nil}}}}, true, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, tc.a)
			for _, c := range []struct {
				name string
				conn Conn
				want bool
			}{{"tls", tlsConn, tc.tls}, {"tls_alt", tlsConnAlt, tc.alt}, {"plaintext", plaintextConn, tc.plaintext}} {
				if got := policyMatches(p, c.conn); got != c.want {
					t.Errorf("%s: matches = %v, want %v", c.name, got, c.want)
				}
			}
		})
	}
}
