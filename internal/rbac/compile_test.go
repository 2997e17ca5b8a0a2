package rbac

import (
	"errors"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

func TestCompileErrors(t *testing.T) {
	// at puts m at rule 0 clause 1 match 2, behind valid neighbours.
	at := func(m *securitypb.Match) *securitypb.Authorization {
		ok := &securitypb.Match{DestinationPorts: []uint32{80}}
		return authz(deny, [][]*securitypb.Match{{ok}, {ok, ok, m}})
	}
	cases := []struct {
		name   string
		a      *securitypb.Authorization
		reason CompileReason
		want   string
	}{
		{"nil", nil, ReasonNilPolicy, `rbac: compile: nil Authorization`},
		{"unknown scope", &securitypb.Authorization{Name: "name", Namespace: "ns", Scope: 7},
			ReasonUnknownScope, `rbac: policy "ns/name": scope: unknown value 7`},
		{"negative scope", &securitypb.Authorization{Name: "name", Namespace: "ns", Scope: -1},
			ReasonUnknownScope, `rbac: policy "ns/name": scope: unknown value -1`},
		{"unknown action", &securitypb.Authorization{Name: "name", Namespace: "ns", Action: 2},
			ReasonUnknownAction, `rbac: policy "ns/name": action: unknown value 2`},
		{"source_ips 3 bytes", at(&securitypb.Match{SourceIps: []*securitypb.Address{{Address: []byte{1, 2, 3}, Length: 24}}}),
			ReasonIPLength, `rbac: policy "ns/name": rule 0 clause 1 match 2: source_ips[0]: want 4 or 16 bytes, got 3`},
		{"not_source_ips empty bytes", at(&securitypb.Match{NotSourceIps: []*securitypb.Address{cidr(t, "10.0.0.0/8"), {}}}),
			ReasonIPLength, `rbac: policy "ns/name": rule 0 clause 1 match 2: not_source_ips[1]: want 4 or 16 bytes, got 0`},
		{"destination_ips nil entry", at(&securitypb.Match{DestinationIps: []*securitypb.Address{nil}}),
			ReasonIPLength, `rbac: policy "ns/name": rule 0 clause 1 match 2: destination_ips[0]: want 4 or 16 bytes, got 0`},
		{"destination_ips v4 length 33", at(&securitypb.Match{DestinationIps: []*securitypb.Address{{Address: []byte{10, 0, 0, 0}, Length: 33}}}),
			ReasonPrefixLength, `rbac: policy "ns/name": rule 0 clause 1 match 2: destination_ips[0]: prefix length 33 exceeds 32 bits`},
		{"not_destination_ips v6 length 129", at(&securitypb.Match{NotDestinationIps: []*securitypb.Address{{Address: make([]byte, 16), Length: 129}}}),
			ReasonPrefixLength, `rbac: policy "ns/name": rule 0 clause 1 match 2: not_destination_ips[0]: prefix length 129 exceeds 128 bits`},
		{"length that truncates to valid is still rejected", at(&securitypb.Match{SourceIps: []*securitypb.Address{{Address: []byte{10, 0, 0, 0}, Length: 256 + 8}}}),
			ReasonPrefixLength, `rbac: policy "ns/name": rule 0 clause 1 match 2: source_ips[0]: prefix length 264 exceeds 32 bits`},
		{"destination_ports 65536", at(&securitypb.Match{DestinationPorts: []uint32{443, 65536}}),
			ReasonPortRange, `rbac: policy "ns/name": rule 0 clause 1 match 2: destination_ports[1]: port 65536 out of range 0-65535`},
		{"not_destination_ports huge", at(&securitypb.Match{NotDestinationPorts: []uint32{4294967295}}),
			ReasonPortRange, `rbac: policy "ns/name": rule 0 clause 1 match 2: not_destination_ports[0]: port 4294967295 out of range 0-65535`},
		{"error after an always-true rule still found",
			authz(deny, [][]*securitypb.Match{}, [][]*securitypb.Match{{{DestinationPorts: []uint32{70000}}}}),
			ReasonPortRange, `rbac: policy "ns/name": rule 1 clause 0 match 0: destination_ports[0]: port 70000 out of range 0-65535`},
		{"error inside an unevaluable match still found",
			single(allow, &securitypb.Match{Extensions: ext(), SourceIps: []*securitypb.Address{{Address: []byte{1}}}}),
			ReasonIPLength, `rbac: policy "ns/name": rule 0 clause 0 match 0: source_ips[0]: want 4 or 16 bytes, got 1`},
		{"error inside an unknown clause still found",
			&securitypb.Authorization{Name: "name", Namespace: "ns", Action: deny, Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{
				withUnknown(&securitypb.Clause{Matches: []*securitypb.Match{{DestinationPorts: []uint32{1 << 20}}}})}}}},
			ReasonPortRange, `rbac: policy "ns/name": rule 0 clause 0 match 0: destination_ports[0]: port 1048576 out of range 0-65535`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(tc.a)
			if err == nil {
				t.Fatalf("Compile = %+v, want error %q", p, tc.want)
			}
			// A malformed entry still yields the fail-closed policy; a
			// malformed resource yields none.
			whole := tc.reason == ReasonNilPolicy || tc.reason == ReasonUnknownScope || tc.reason == ReasonUnknownAction
			if whole && p != nil {
				t.Errorf("Compile returned a policy for a malformed resource")
			}
			if !whole && p == nil {
				t.Errorf("Compile returned no fail-closed policy for a malformed entry")
			}
			if err.Error() != tc.want {
				t.Errorf("error\n got %s\nwant %s", err, tc.want)
			}
			var ce *CompileError
			if !errors.As(err, &ce) || ce.Reason != tc.reason {
				t.Errorf("errors.As CompileError reason = %v, want %v", ce, tc.reason)
			}
		})
	}
}

func TestCompileFields(t *testing.T) {
	cases := []struct {
		name   string
		a      *securitypb.Authorization
		scope  Scope
		action Action
		dryRun bool
	}{
		{"defaults", &securitypb.Authorization{Name: "n", Namespace: "s"}, ScopeGlobal, Allow, false},
		{"namespace deny", &securitypb.Authorization{Name: "n", Namespace: "s", Scope: securitypb.Scope_NAMESPACE, Action: deny}, ScopeNamespace, Deny, false},
		{"selector dry run", &securitypb.Authorization{Name: "n", Namespace: "s", Scope: securitypb.Scope_WORKLOAD_SELECTOR, DryRun: true}, ScopeWorkloadSelector, Allow, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, tc.a)
			if p.Name != "n" || p.Namespace != "s" || p.Key() != "s/n" || p.Source != tc.a {
				t.Errorf("identity fields = %q %q %q %p, want n s s/n %p", p.Name, p.Namespace, p.Key(), p.Source, tc.a)
			}
			if p.Scope != tc.scope || p.Action != tc.action || p.DryRun != tc.dryRun {
				t.Errorf("Scope, Action, DryRun = %v %v %v, want %v %v %v", p.Scope, p.Action, p.DryRun, tc.scope, tc.action, tc.dryRun)
			}
		})
	}
}

// TestCompileFolding checks that constant subtrees are folded away, which
// is what keeps Evaluate's walk short.
func TestCompileFolding(t *testing.T) {
	l4 := &securitypb.Match{DestinationPorts: []uint32{80}}
	cases := []struct {
		name  string
		a     *securitypb.Authorization
		fixed tri
		rules int
	}{
		{"no rules", authz(allow), alwaysFalse, 0},
		{"empty rule", authz(allow, [][]*securitypb.Match{}), alwaysTrue, 0},
		{"l4 rule", single(allow, l4), evaluate, 1},
		{"ALLOW empty match rule dropped", authz(allow, [][]*securitypb.Match{{{}}}, [][]*securitypb.Match{{l4}}), evaluate, 1},
		{"DENY empty match rule folds policy", authz(deny, [][]*securitypb.Match{{{}}}, [][]*securitypb.Match{{l4}}), alwaysTrue, 0},
		{"ALLOW only unevaluable", single(allow, &securitypb.Match{Extensions: ext()}), alwaysFalse, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, tc.a)
			if p.fixed != tc.fixed || len(p.rules) != tc.rules {
				t.Errorf("fixed, rules = %d, %d; want %d, %d", p.fixed, len(p.rules), tc.fixed, tc.rules)
			}
		})
	}
}
