package rbac

import (
	"errors"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// TestFaultMalformedEntryFailsClosed: a list entry Compile cannot read (bad
// IP length, prefix length or port) is reported as a *CompileError and, in
// the returned policy, resolved toward denying, exactly like an unknown
// match kind. Before, the whole Authorization was rejected and a new DENY
// was therefore not enforced at all (fail open). Connections as in
// TestFailClosed: plaintext and tls to 127.0.0.2:8080, tls_alt to
// 127.0.0.4:9090.
func TestFaultMalformedEntryFailsClosed(t *testing.T) {
	type want struct{ plaintext, tls, alt bool }
	badIP := &securitypb.Address{Address: []byte{10, 0, 0}, Length: 24}
	badPrefix := &securitypb.Address{Address: []byte{10, 0, 0, 0}, Length: 40}
	cases := []struct {
		name   string
		a      *securitypb.Authorization
		reason CompileReason
		want   want
	}{
		{"DENY bad source CIDR holds, port still applies",
			single(deny, &securitypb.Match{SourceIps: []*securitypb.Address{badIP}, DestinationPorts: []uint32{8080}}),
			ReasonIPLength, want{true, true, false}},
		{"DENY bad source CIDR only: denies all",
			single(deny, &securitypb.Match{SourceIps: []*securitypb.Address{badIP}}),
			ReasonIPLength, want{true, true, true}},
		{"DENY bad prefix beside a CIDR that misses: holds",
			single(deny, &securitypb.Match{DestinationIps: []*securitypb.Address{cidr(t, "192.168.0.0/16"), badPrefix}}),
			ReasonPrefixLength, want{true, true, true}},
		{"DENY bad not_destination_ips entry ignored",
			single(deny, &securitypb.Match{NotDestinationIps: []*securitypb.Address{badPrefix, cidr(t, "127.0.0.4/32")}}),
			ReasonPrefixLength, want{true, true, false}},
		{"DENY port out of range holds",
			single(deny, &securitypb.Match{DestinationPorts: []uint32{70000}, Namespaces: strs(exact("ns-alt"))}),
			ReasonPortRange, want{false, false, true}},
		{"ALLOW bad source CIDR only: never matches",
			single(allow, &securitypb.Match{SourceIps: []*securitypb.Address{badIP}}),
			ReasonIPLength, want{}},
		{"ALLOW port out of range ignored beside a good one",
			single(allow, &securitypb.Match{DestinationPorts: []uint32{70000, 9090}}),
			ReasonPortRange, want{false, false, true}},
	}
	conns := []Conn{plaintextConn, tlsConn, tlsConnAlt}
	var denied int
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(tc.a)
			var ce *CompileError
			if !errors.As(err, &ce) || ce.Reason != tc.reason {
				t.Fatalf("Compile error = %v, want a CompileError with reason %s", err, tc.reason)
			}
			if p == nil {
				t.Fatal("Compile returned no policy: the DENY would be skipped")
			}
			if u := strings.Join(p.Unevaluable(), ";"); !strings.Contains(u, "malformed entry ("+string(tc.reason)+")") {
				t.Errorf("Unevaluable() = %q, want the malformed entry named", u)
			}
			want := []bool{tc.want.plaintext, tc.want.tls, tc.want.alt}
			for i, name := range []string{"plaintext", "tls", "tls_alt"} {
				got := policyMatches(p, conns[i])
				if got != want[i] {
					t.Errorf("%s: matches = %v, want %v", name, got, want[i])
				}
				if got && p.Action == Deny {
					denied++
				}
			}
		})
	}
	t.Logf("fault rbac-malformed-entry: cases=%d deny_matches=%d skipped_denies=0", len(cases), denied)
}
