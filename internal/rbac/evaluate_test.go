package rbac

import (
	"reflect"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// named builds a policy ns1/<name> matching the principal (or everything
// when principal is "", via a rule without clauses).
func named(t *testing.T, name string, action securitypb.Action, dryRun bool, principal string) *Policy {
	t.Helper()
	a := &securitypb.Authorization{Name: name, Namespace: "ns1", Action: action, DryRun: dryRun,
		Scope: securitypb.Scope_NAMESPACE}
	if principal == "" {
		a.Rules = []*securitypb.Rule{{}}
	} else {
		a.Rules = []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{
			{Principals: strs(exact(principal))}}}}}}
	}
	return mustCompile(t, a)
}

func conn(account string) Conn {
	c := tlsConn
	c.SrcIdentity = "spiffe://cluster.local/ns/default/sa/" + account
	return c
}

// TestEvaluate follows upstream's assert_rbac tests and the Istio order:
// DENY first, no ALLOW means allow, an ALLOW must match otherwise.
func TestEvaluate(t *testing.T) {
	const (
		defaultAcct = "cluster.local/ns/default/sa/defaultacct"
		denyAcct    = "cluster.local/ns/default/sa/denyacct"
	)
	allowDefault := named(t, "allow", allow, false, defaultAcct)
	denyDeny := named(t, "deny", deny, false, denyAcct)
	dryAllowAll := named(t, "dry-allow-all", allow, true, "")
	dryDenyAll := named(t, "dry-deny-all", deny, true, "")
	dryAllowDefault := named(t, "dry-allow-default", allow, true, defaultAcct)
	dryDenyDefault := named(t, "dry-deny-default", deny, true, defaultAcct)
	denyAll := named(t, "deny-all", deny, false, "")
	allowNothing := mustCompile(t, &securitypb.Authorization{Name: "allow-nothing", Namespace: "ns1"})
	denyNothing := mustCompile(t, &securitypb.Authorization{Name: "deny-nothing", Namespace: "ns1", Action: deny})

	cases := []struct {
		name     string
		policies []*Policy
		conn     Conn
		want     Decision
	}{
		{name: "no policies allow", conn: conn("x"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{name: "only non-matching deny allows", policies: []*Policy{denyDeny}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{name: "matching allow allows", policies: []*Policy{denyDeny, allowDefault}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Policy: "ns1/allow", Reason: ReasonAllowMatched}},
		{name: "allow without match denies", policies: []*Policy{denyDeny, allowDefault}, conn: conn("not-defaultacct"),
			want: Decision{Reason: ReasonNotAllowed}},
		{name: "deny before allow", policies: []*Policy{allowDefault, named(t, "deny-default", deny, false, defaultAcct)}, conn: conn("defaultacct"),
			want: Decision{Policy: "ns1/deny-default", Reason: ReasonExplicitlyDenied}},
		{name: "matching deny denies", policies: []*Policy{allowDefault, denyDeny}, conn: conn("denyacct"),
			want: Decision{Policy: "ns1/deny", Reason: ReasonExplicitlyDenied}},
		{name: "allow with no rules denies everything", policies: []*Policy{allowNothing}, conn: conn("defaultacct"),
			want: Decision{Reason: ReasonNotAllowed}},
		{name: "deny with no rules denies nothing", policies: []*Policy{denyNothing}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{name: "first matching deny decides", policies: []*Policy{denyAll, denyDeny}, conn: conn("denyacct"),
			want: Decision{Policy: "ns1/deny-all", Reason: ReasonExplicitlyDenied}},
		{name: "plaintext against principal allow denied", policies: []*Policy{allowDefault}, conn: plaintextConn,
			want: Decision{Reason: ReasonNotAllowed}},
		{name: "nil entries skipped", policies: []*Policy{nil, allowDefault, nil}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Policy: "ns1/allow", Reason: ReasonAllowMatched}},
		{name: "uncompiled literal matches nothing", policies: []*Policy{{Name: "lit", Namespace: "ns1", Action: Deny}}, conn: conn("x"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},

		// Dry run: evaluated and reported, never enforced.
		{name: "dry-run wildcards have no effect", policies: []*Policy{dryAllowAll, dryDenyAll, allowDefault, denyDeny}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Policy: "ns1/allow", Reason: ReasonAllowMatched, DryRun: []DryRunResult{
				{"ns1/dry-deny-all", Deny}, {"ns1/dry-allow-all", Allow}}}},
		{name: "dry-run deny reported, not enforced", policies: []*Policy{dryDenyDefault}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRun: []DryRunResult{{"ns1/dry-deny-default", Deny}}}},
		{name: "dry-run deny not matching not reported", policies: []*Policy{dryDenyDefault}, conn: conn("other"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{name: "dry-run deny reported when enforced deny decides", policies: []*Policy{denyDeny, dryDenyAll, dryAllowAll}, conn: conn("denyacct"),
			want: Decision{Policy: "ns1/deny", Reason: ReasonExplicitlyDenied, DryRun: []DryRunResult{{"ns1/dry-deny-all", Deny}}}},
		{name: "dry-run allow alone does not deny", policies: []*Policy{dryAllowDefault}, conn: conn("other"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRunNoAllowMatch: true}},
		{name: "dry-run allow alone matching", policies: []*Policy{dryAllowDefault}, conn: conn("defaultacct"),
			want: Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRun: []DryRunResult{{"ns1/dry-allow-default", Allow}}}},
		{name: "dry-run allow does not rescue", policies: []*Policy{allowDefault, dryAllowAll}, conn: conn("other"),
			want: Decision{Reason: ReasonNotAllowed, DryRun: []DryRunResult{{"ns1/dry-allow-all", Allow}}}},
		{name: "no-allow-match flag only without enforced allow", policies: []*Policy{allowDefault, dryAllowDefault}, conn: conn("other"),
			want: Decision{Reason: ReasonNotAllowed}},
		{name: "upstream dry run with real policies", policies: []*Policy{
			named(t, "real-deny", deny, false, denyAcct), dryDenyDefault, named(t, "real-allow", allow, false, defaultAcct), dryAllowDefault},
			conn: conn("defaultacct"),
			want: Decision{Allowed: true, Policy: "ns1/real-allow", Reason: ReasonAllowMatched, DryRun: []DryRunResult{
				{"ns1/dry-deny-default", Deny}, {"ns1/dry-allow-default", Allow}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Evaluate(tc.policies, tc.conn)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Evaluate =\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

func TestDecisionString(t *testing.T) {
	cases := []struct {
		name string
		d    Decision
		want string
	}{
		{"denied", Decision{Policy: "ns/p", Reason: ReasonExplicitlyDenied}, "explicitly denied by: ns/p"},
		{"not allowed", Decision{Reason: ReasonNotAllowed}, "allow policies exist, but none allowed"},
		{"no allow", Decision{Allowed: true, Reason: ReasonNoAllowPolicies}, "no allow policies, allow"},
		{"allowed", Decision{Allowed: true, Policy: "ns/a", Reason: ReasonAllowMatched}, "allow policy match: ns/a"},
		{"zero", Decision{}, "no decision"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSelects(t *testing.T) {
	cases := []struct {
		name  string
		scope securitypb.Scope
		wlNS  string
		want  bool
	}{
		{"global other namespace", securitypb.Scope_GLOBAL, "other", true},
		{"global own namespace", securitypb.Scope_GLOBAL, "ns", true},
		{"namespace same", securitypb.Scope_NAMESPACE, "ns", true},
		{"namespace other", securitypb.Scope_NAMESPACE, "other", false},
		{"workload selector same namespace", securitypb.Scope_WORKLOAD_SELECTOR, "ns", false},
		{"workload selector other namespace", securitypb.Scope_WORKLOAD_SELECTOR, "other", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, &securitypb.Authorization{Name: "p", Namespace: "ns", Scope: tc.scope})
			if got := p.Selects(tc.wlNS); got != tc.want {
				t.Errorf("Selects(%q) = %v, want %v", tc.wlNS, got, tc.want)
			}
		})
	}
}

func TestStringers(t *testing.T) {
	cases := []struct {
		name string
		got  string
		want string
	}{
		{"scope global", ScopeGlobal.String(), "Global"},
		{"scope namespace", ScopeNamespace.String(), "Namespace"},
		{"scope selector", ScopeWorkloadSelector.String(), "WorkloadSelector"},
		{"scope unknown", Scope(9).String(), "Scope(9)"},
		{"action allow", Allow.String(), "Allow"},
		{"action deny", Deny.String(), "Deny"},
		{"action unknown", Action(5).String(), "Action(5)"},
		{"key compiled", mustCompile(t, &securitypb.Authorization{Name: "n", Namespace: "s"}).Key(), "s/n"},
		{"key literal", (&Policy{Name: "n", Namespace: "s"}).Key(), "s/n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}
