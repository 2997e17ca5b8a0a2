package rbac

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"google.golang.org/protobuf/proto"
)

// CompileReason names why Compile rejected an Authorization; values are
// stable metric labels.
type CompileReason string

const (
	ReasonNilPolicy     CompileReason = "nil_policy"     // Compile(nil)
	ReasonUnknownScope  CompileReason = "unknown_scope"  // scope number outside the enum
	ReasonUnknownAction CompileReason = "unknown_action" // action number outside the enum
	ReasonIPLength      CompileReason = "ip_length"      // Address not 4 or 16 bytes
	ReasonPrefixLength  CompileReason = "prefix_length"  // Address length beyond its bits
	ReasonPortRange     CompileReason = "port_range"     // port above 65535
)

// CompileError is the error Compile returns; use errors.As to read Reason.
type CompileError struct {
	Policy string        // Key() of the rejected policy
	Path   string        // where, e.g. "rule 0 clause 1 match 2: source_ips[0]"; "" for the whole resource
	Reason CompileReason // label-safe; one of the Reason* constants
	Detail string        // what was wrong, e.g. "want 4 or 16 bytes, got 3"
}

func (e *CompileError) Error() string {
	switch {
	case e.Reason == ReasonNilPolicy:
		return "rbac: compile: " + e.Detail
	case e.Path == "":
		return fmt.Sprintf("rbac: policy %q: %s", e.Policy, e.Detail)
	}
	return fmt.Sprintf("rbac: policy %q: %s: %s", e.Policy, e.Path, e.Detail)
}

// Compile validates a and returns its compiled form. The returned Policy
// keeps a as Source; a must not be modified afterwards.
//
// A malformed list entry (bad IP length, prefix length or port) makes
// Compile return a *CompileError for the first one and, with it, a non-nil
// fail-closed Policy in which every malformed entry is treated as
// unevaluable (see the package comment): a DENY that cannot be read in full
// still denies at least what it would have covered, and an ALLOW allows no
// more. Callers that reject the resource (NACK) should still enforce that
// Policy rather than skip the DENY (istio/istio#61126). Errors on the whole
// resource (nil, unknown scope or action) return a nil Policy.
func Compile(a *securitypb.Authorization) (*Policy, error) {
	if a == nil {
		return nil, &CompileError{Reason: ReasonNilPolicy, Detail: "nil Authorization"}
	}
	p := &Policy{Name: a.GetName(), Namespace: a.GetNamespace(), DryRun: a.GetDryRun(), Source: a}
	p.key = p.Namespace + "/" + p.Name
	switch s := a.GetScope(); s {
	case securitypb.Scope_GLOBAL:
		p.Scope = ScopeGlobal
	case securitypb.Scope_NAMESPACE:
		p.Scope = ScopeNamespace
	case securitypb.Scope_WORKLOAD_SELECTOR:
		p.Scope = ScopeWorkloadSelector
	default:
		return nil, &CompileError{Policy: p.key, Path: "scope", Reason: ReasonUnknownScope,
			Detail: fmt.Sprintf("unknown value %d", int32(s))}
	}
	switch act := a.GetAction(); act {
	case securitypb.Action_ALLOW:
		p.Action = Allow
	case securitypb.Action_DENY:
		p.Action = Deny
	default:
		return nil, &CompileError{Policy: p.key, Path: "action", Reason: ReasonUnknownAction,
			Detail: fmt.Sprintf("unknown value %d", int32(act))}
	}
	c := compiler{key: p.key, deny: p.Action == Deny}
	c.policy(p, a.GetRules())
	p.unevaluable = c.notes
	if c.err != nil {
		return p, c.err
	}
	return p, nil
}

// compiler carries the position (for errors and notes) while one policy
// compiles. Unevaluable conditions resolve toward denying: assumed to hold
// in a DENY policy (deny), assumed not to in an ALLOW.
type compiler struct {
	key                 string
	deny                bool
	rule, clause, match int
	inClause, inMatch   bool
	notes               []string
	err                 *CompileError // the first malformed entry, if any
}

func (c *compiler) loc() string {
	switch {
	case c.inMatch:
		return fmt.Sprintf("rule %d clause %d match %d", c.rule, c.clause, c.match)
	case c.inClause:
		return fmt.Sprintf("rule %d clause %d", c.rule, c.clause)
	}
	return fmt.Sprintf("rule %d", c.rule)
}

func (c *compiler) note(what string) { c.notes = append(c.notes, c.loc()+": "+what) }

// malformed records a malformed entry: the first becomes Compile's error,
// each becomes an Unevaluable note, and the entry resolves fail-closed.
func (c *compiler) malformed(field string, i int, e *fieldError) {
	path := fmt.Sprintf("%s: %s[%d]", c.loc(), field, i)
	if c.err == nil {
		c.err = &CompileError{Policy: c.key, Path: path, Reason: e.reason, Detail: e.detail}
	}
	c.notes = append(c.notes, fmt.Sprintf("%s: malformed entry (%s)", path, e.reason))
}

// unknownVerdict is what an unevaluable node becomes.
func (c *compiler) unknownVerdict() tri {
	if c.deny {
		return alwaysTrue
	}
	return alwaysFalse
}

func hasUnknown(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

func (c *compiler) policy(p *Policy, in []*securitypb.Rule) {
	// No rules: the policy matches nothing (upstream "empty rules"). An ALLOW
	// without rules therefore still counts as an ALLOW and, alone, denies
	// everything — Istio's documented allow-nothing policy; a DENY without
	// rules denies nothing.
	p.fixed = alwaysFalse
	for i, r := range in {
		c.rule = i
		t, compiled := c.compileRule(r)
		switch t {
		case alwaysTrue:
			p.fixed = alwaysTrue
		case evaluate:
			p.rules = append(p.rules, compiled)
		}
	}
	if p.fixed == alwaysTrue {
		p.rules = nil
	} else if len(p.rules) > 0 {
		p.fixed = evaluate
	}
}

// compileRule: a rule with no clauses holds (upstream); clauses that always
// hold are dropped, one that never holds makes the rule never hold. Every
// node is compiled even once the outcome is known, so malformed input
// anywhere is reported.
func (c *compiler) compileRule(r *securitypb.Rule) (tri, rule) {
	c.inClause, c.inMatch = false, false
	verdict := evaluate
	if r != nil && hasUnknown(r) {
		c.note("unknown rule fields")
		verdict = c.unknownVerdict()
	}
	var out rule
	for j, cl := range r.GetClauses() {
		c.clause, c.inClause, c.inMatch = j, true, false
		t, compiled := c.compileClause(cl)
		switch t {
		case alwaysFalse:
			if verdict == evaluate {
				verdict = alwaysFalse
			}
		case evaluate:
			out.clauses = append(out.clauses, compiled)
		}
	}
	if verdict != evaluate {
		return verdict, rule{}
	}
	if len(out.clauses) == 0 {
		return alwaysTrue, rule{}
	}
	return evaluate, out
}

// compileClause: a clause with no matches holds (upstream); matches that
// never hold are dropped, one that always holds makes the clause hold.
func (c *compiler) compileClause(cl *securitypb.Clause) (tri, clause) {
	verdict := evaluate
	if cl != nil && hasUnknown(cl) {
		c.note("unknown clause fields")
		verdict = c.unknownVerdict()
	}
	in := cl.GetMatches()
	var out clause
	for k, m := range in {
		c.match, c.inMatch = k, true
		t, compiled := c.compileMatch(m)
		switch t {
		case alwaysTrue:
			if verdict == evaluate {
				verdict = alwaysTrue
			}
		case evaluate:
			out.alts = append(out.alts, compiled)
		}
	}
	c.inMatch = false
	switch {
	case verdict != evaluate:
		return verdict, clause{}
	case len(in) == 0:
		return alwaysTrue, clause{}
	case len(out.alts) == 0:
		return alwaysFalse, clause{}
	}
	return evaluate, out
}

func (c *compiler) compileMatch(m *securitypb.Match) (tri, match) {
	if m == nil {
		m = &securitypb.Match{}
	}
	never := false // an ALLOW condition that cannot hold
	if len(m.GetExtensions()) > 0 {
		c.note("extensions")
		never = !c.deny
	}
	if hasUnknown(m) {
		c.note("unknown match fields")
		never = !c.deny
	}
	if isEmptyMatch(m) && len(m.GetExtensions()) == 0 && !hasUnknown(m) {
		// What istiod sends for a rule whose conditions were all HTTP
		// attributes. Upstream skips it (never matches); for a DENY that
		// means not enforcing the policy at all, so fail closed.
		c.note("no conditions (L7-only rule)")
	}
	var out match
	var n [12]bool
	out.namespaces, n[0] = list(c, "namespaces", m.GetNamespaces(), false, convStr)
	out.notNamespaces, n[1] = list(c, "not_namespaces", m.GetNotNamespaces(), true, convStr)
	out.serviceAccounts, n[2] = list(c, "service_accounts", m.GetServiceAccounts(), false, convSA)
	out.notServiceAccounts, n[3] = list(c, "not_service_accounts", m.GetNotServiceAccounts(), true, convSA)
	out.principals, n[4] = list(c, "principals", m.GetPrincipals(), false, convStr)
	out.notPrincipals, n[5] = list(c, "not_principals", m.GetNotPrincipals(), true, convStr)
	out.srcIPs, n[6] = list(c, "source_ips", m.GetSourceIps(), false, convAddr)
	out.notSrcIPs, n[7] = list(c, "not_source_ips", m.GetNotSourceIps(), true, convAddr)
	out.dstIPs, n[8] = list(c, "destination_ips", m.GetDestinationIps(), false, convAddr)
	out.notDstIPs, n[9] = list(c, "not_destination_ips", m.GetNotDestinationIps(), true, convAddr)
	out.ports, n[10] = list(c, "destination_ports", m.GetDestinationPorts(), false, convPort)
	out.notPorts, n[11] = list(c, "not_destination_ports", m.GetNotDestinationPorts(), true, convPort)
	out.ports, out.notPorts = sortPorts(out.ports), sortPorts(out.notPorts)
	if never || slices.Contains(n[:], true) {
		return alwaysFalse, match{}
	}
	if out.isEmpty() {
		// No condition left to check: a DENY match that held everything
		// unevaluable (or had no conditions) holds; in an ALLOW only an
		// empty Match gets here, and upstream never matches it.
		return c.unknownVerdict(), match{}
	}
	return evaluate, out
}

func isEmptyMatch(m *securitypb.Match) bool {
	return len(m.GetNamespaces())+len(m.GetNotNamespaces())+
		len(m.GetServiceAccounts())+len(m.GetNotServiceAccounts())+
		len(m.GetPrincipals())+len(m.GetNotPrincipals())+
		len(m.GetSourceIps())+len(m.GetNotSourceIps())+
		len(m.GetDestinationIps())+len(m.GetNotDestinationIps())+
		len(m.GetDestinationPorts())+len(m.GetNotDestinationPorts()) == 0
}

func (m *match) isEmpty() bool {
	return len(m.namespaces)+len(m.notNamespaces)+
		len(m.serviceAccounts)+len(m.notServiceAccounts)+
		len(m.principals)+len(m.notPrincipals)+
		len(m.srcIPs)+len(m.notSrcIPs)+len(m.dstIPs)+len(m.notDstIPs)+
		len(m.ports)+len(m.notPorts) == 0
}

type fieldError struct {
	reason CompileReason
	detail string
}

// list converts one repeated field. conv reports ok=false for an entry it
// cannot evaluate, and an error for a malformed one (recorded, then treated
// the same); such entries resolve toward denying:
//
//	DENY,  positive list: the field is assumed to hold (returned nil).
//	DENY,  not_ list:     the entry is assumed not to match (dropped).
//	ALLOW, positive list: the entry is assumed not to match (dropped); a list
//	                      left empty can never hold (never=true).
//	ALLOW, not_ list:     the entry is assumed to match, so the field can
//	                      never hold (never=true).
func list[S, T any](c *compiler, field string, in []S, negative bool, conv func(S) (T, bool, *fieldError)) (out []T, never bool) {
	if len(in) == 0 {
		return nil, false
	}
	out = make([]T, 0, len(in))
	unknown := false
	for i, s := range in {
		v, ok, ferr := conv(s)
		if ferr != nil {
			c.malformed(field, i, ferr)
			unknown = true
			continue
		}
		if !ok {
			c.note(fmt.Sprintf("%s[%d]: unsupported entry", field, i))
			unknown = true
			continue
		}
		out = append(out, v)
	}
	switch {
	case !unknown:
		return out, false
	case c.deny && !negative:
		return nil, false
	case c.deny:
		return out, false
	case !negative && len(out) > 0:
		return out, false
	}
	return nil, true
}

func convStr(s *securitypb.StringMatch) (strMatch, bool, *fieldError) {
	if s == nil || hasUnknown(s) {
		return strMatch{}, false, nil
	}
	switch t := s.GetMatchType().(type) {
	case *securitypb.StringMatch_Exact:
		return strMatch{kind: strExact, value: t.Exact}, true, nil
	case *securitypb.StringMatch_Prefix:
		return strMatch{kind: strPrefix, value: t.Prefix}, true, nil
	case *securitypb.StringMatch_Suffix:
		return strMatch{kind: strSuffix, value: t.Suffix}, true, nil
	case *securitypb.StringMatch_Presence:
		return strMatch{kind: strPresence}, true, nil
	}
	// No match type: a kind this build does not know (its field then sits
	// in the unknown fields) or a malformed entry; either way unevaluable.
	return strMatch{}, false, nil
}

func convSA(s *securitypb.ServiceAccountMatch) (saMatch, bool, *fieldError) {
	if s != nil && hasUnknown(s) {
		return saMatch{}, false, nil
	}
	return saMatch{namespace: s.GetNamespace(), serviceAccount: s.GetServiceAccount()}, true, nil
}

func convAddr(a *securitypb.Address) (netip.Prefix, bool, *fieldError) {
	b := a.GetAddress()
	var ip netip.Addr
	switch len(b) {
	case 4:
		ip = netip.AddrFrom4([4]byte(b))
	case 16:
		// Kept as IPv6 even when v4-mapped, as upstream.
		ip = netip.AddrFrom16([16]byte(b))
	default:
		return netip.Prefix{}, false, &fieldError{ReasonIPLength, fmt.Sprintf("want 4 or 16 bytes, got %d", len(b))}
	}
	// Length 0 is a /0: the whole address family, as upstream (istiod
	// always sends the full bit length for a bare IP).
	if l := a.GetLength(); l > uint32(ip.BitLen()) {
		return netip.Prefix{}, false, &fieldError{ReasonPrefixLength, fmt.Sprintf("prefix length %d exceeds %d bits", l, ip.BitLen())}
	}
	if hasUnknown(a) {
		return netip.Prefix{}, false, nil
	}
	return netip.PrefixFrom(ip, int(a.GetLength())).Masked(), true, nil
}

func convPort(p uint32) (uint16, bool, *fieldError) {
	if p > 65535 {
		return 0, false, &fieldError{ReasonPortRange, fmt.Sprintf("port %d out of range 0-65535", p)}
	}
	return uint16(p), true, nil
}

func sortPorts(l []uint16) []uint16 {
	slices.Sort(l)
	return slices.Compact(l)
}
