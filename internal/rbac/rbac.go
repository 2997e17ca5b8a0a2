package rbac

import (
	"net/netip"
	"strconv"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// Scope says which workloads a policy applies to.
type Scope int

const (
	ScopeGlobal           Scope = iota // every workload in the mesh
	ScopeNamespace                     // workloads in Policy.Namespace
	ScopeWorkloadSelector              // workloads that list the policy by name
)

func (s Scope) String() string {
	switch s {
	case ScopeGlobal:
		return "Global"
	case ScopeNamespace:
		return "Namespace"
	case ScopeWorkloadSelector:
		return "WorkloadSelector"
	}
	return "Scope(" + strconv.Itoa(int(s)) + ")"
}

// Action is what a matching policy does.
type Action int

const (
	Allow Action = iota
	Deny
)

func (a Action) String() string {
	switch a {
	case Allow:
		return "Allow"
	case Deny:
		return "Deny"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Policy is a compiled, immutable Authorization. Build it with [Compile]; a
// Policy literal has no compiled rules and matches nothing. A Policy is safe
// for concurrent use and must not be modified after Compile returns it.
type Policy struct {
	Name      string
	Namespace string
	Scope     Scope
	Action    Action
	DryRun    bool
	// Source is the resource it was compiled from (for config_dump).
	Source *securitypb.Authorization

	// Compiled form; immutable after Compile.
	key         string // Namespace + "/" + Name, built once
	fixed       tri    // alwaysTrue / alwaysFalse when rules fold to a constant
	rules       []rule // only rules that need evaluating
	unevaluable []string
}

// Key is the policy's "namespace/name", the form workloads reference.
func (p *Policy) Key() string {
	if p.key != "" {
		return p.key
	}
	return p.Namespace + "/" + p.Name
}

// Selects reports whether p applies, by its scope alone, to a workload in
// workloadNamespace: Global policies apply to every workload, Namespace
// policies to workloads in p.Namespace, and WorkloadSelector policies to
// none — those apply only to workloads that list p.Key(). Upstream's
// selection is the union of the scope-selected policies and the listed ones
// (a listed policy is included whatever its scope).
func (p *Policy) Selects(workloadNamespace string) bool {
	switch p.Scope {
	case ScopeGlobal:
		return true
	case ScopeNamespace:
		return p.Namespace == workloadNamespace
	}
	return false
}

// Unevaluable lists, as "rule R clause C match M: what", the conditions that
// Compile could not evaluate at L4 and resolved fail-closed (see the package
// doc). Empty for a fully L4 policy. The caller must not modify the slice.
func (p *Policy) Unevaluable() []string { return p.unevaluable }

// Conn holds the attributes of one connection that policies can match.
type Conn struct {
	// SrcIP is the peer's address as seen by the listener.
	SrcIP netip.Addr
	// DstIP and DstPort are the real destination: for HBONE the CONNECT
	// target (not the 15008 listener), for plaintext the original
	// destination.
	DstIP   netip.Addr
	DstPort uint16
	// SrcIdentity is the peer's SPIFFE URI, spiffe://<td>/ns/<ns>/sa/<sa>;
	// "" for plaintext. A string not of that form is treated as no identity,
	// as upstream (its certificate parsing yields no identity for it).
	SrcIdentity string
}

// Reason says why Evaluate decided as it did. Values are stable metric labels.
type Reason string

const (
	// ReasonExplicitlyDenied: an enforced DENY policy matched (Decision.Policy).
	ReasonExplicitlyDenied Reason = "explicitly_denied"
	// ReasonNoAllowPolicies: no DENY matched and no enforced ALLOW policy exists.
	ReasonNoAllowPolicies Reason = "no_allow_policies"
	// ReasonAllowMatched: an enforced ALLOW policy matched (Decision.Policy).
	ReasonAllowMatched Reason = "allow_matched"
	// ReasonNotAllowed: enforced ALLOW policies exist and none matched.
	ReasonNotAllowed Reason = "not_allowed"
)

// DryRunResult is one dry-run policy that matched the connection. Had it
// been enforced, a DENY would have denied the connection and an ALLOW would
// have allowed it (unless a DENY matched first).
type DryRunResult struct {
	Policy string // Key() of the dry-run policy
	Action Action
}

// Decision is the outcome of Evaluate.
type Decision struct {
	Allowed bool
	// Policy is the Key() of the deciding policy, "" when a default decided
	// (ReasonNoAllowPolicies, ReasonNotAllowed).
	Policy string
	Reason Reason
	// DryRun lists the dry-run policies that matched, in evaluation order
	// (DENYs first; ALLOWs are not evaluated when an enforced DENY decided,
	// as upstream). nil when none matched.
	DryRun []DryRunResult
	// DryRunNoAllowMatch is upstream's "dry-run: no allow policies match":
	// the connection was allowed because no enforced ALLOW policy exists,
	// dry-run ALLOW policies exist, and none matched — it would be denied if
	// they were enforced.
	DryRunNoAllowMatch bool
}

// String renders the decision the way upstream words it in logs and
// rejection errors.
func (d Decision) String() string {
	switch d.Reason {
	case ReasonExplicitlyDenied:
		return "explicitly denied by: " + d.Policy
	case ReasonNoAllowPolicies:
		return "no allow policies, allow"
	case ReasonAllowMatched:
		return "allow policy match: " + d.Policy
	case ReasonNotAllowed:
		return "allow policies exist, but none allowed"
	}
	return "no decision"
}

// Evaluate decides whether conn may reach the workload whose applicable
// policies are policies (nil entries are skipped, as upstream skips policies
// a workload references before they arrive). It is pure and safe for
// concurrent use, and allocates only when a dry-run policy matches.
func Evaluate(policies []*Policy, conn Conn) Decision {
	a := newAttrs(conn)
	var d Decision

	// Upstream evaluates dry-run DENYs before enforced ones, so their matches
	// are reported even when an enforced DENY decides.
	for _, p := range policies {
		if p != nil && p.DryRun && p.Action == Deny && p.matches(&a) {
			d.DryRun = append(d.DryRun, DryRunResult{Policy: p.Key(), Action: Deny})
		}
	}
	// "If there are any DENY policies that match the request, deny the request."
	for _, p := range policies {
		if p != nil && !p.DryRun && p.Action == Deny && p.matches(&a) {
			d.Policy, d.Reason = p.Key(), ReasonExplicitlyDenied
			return d
		}
	}
	haveAllow, haveDryAllow, dryAllowMatched := false, false, false
	for _, p := range policies {
		if p == nil || p.Action != Allow {
			continue
		}
		if !p.DryRun {
			haveAllow = true
			continue
		}
		haveDryAllow = true
		if p.matches(&a) {
			dryAllowMatched = true
			d.DryRun = append(d.DryRun, DryRunResult{Policy: p.Key(), Action: Allow})
		}
	}
	// "If there are no ALLOW policies for the workload, allow the request."
	if !haveAllow {
		d.DryRunNoAllowMatch = haveDryAllow && !dryAllowMatched
		d.Allowed, d.Reason = true, ReasonNoAllowPolicies
		return d
	}
	// "If any of the ALLOW policies match the request, allow the request."
	for _, p := range policies {
		if p != nil && !p.DryRun && p.Action == Allow && p.matches(&a) {
			d.Allowed, d.Policy, d.Reason = true, p.Key(), ReasonAllowMatched
			return d
		}
	}
	// "Deny the request."
	d.Reason = ReasonNotAllowed
	return d
}
