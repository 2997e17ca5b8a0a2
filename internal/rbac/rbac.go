package rbac

// STUB CONTRACT — the rbac owner replaces the bodies, keeps these names.

import (
	"net/netip"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// Scope says which workloads a policy applies to.
type Scope int

const (
	ScopeGlobal           Scope = iota // every workload in the mesh
	ScopeNamespace                     // workloads in Policy.Namespace
	ScopeWorkloadSelector              // workloads that list the policy by name
)

// Action is what a matching policy does.
type Action int

const (
	Allow Action = iota
	Deny
)

// Policy is a compiled, immutable Authorization.
type Policy struct {
	Name      string
	Namespace string
	Scope     Scope
	Action    Action
	DryRun    bool
	// Source is the resource it was compiled from (for config_dump).
	Source *securitypb.Authorization
}

// Key is the policy's "namespace/name", the form workloads reference.
func (p *Policy) Key() string { return p.Namespace + "/" + p.Name }

// Compile validates a and returns its compiled form.
func Compile(a *securitypb.Authorization) (*Policy, error) {
	return &Policy{Name: a.GetName(), Namespace: a.GetNamespace(), Source: a}, nil
}

// Conn holds the attributes of one connection that policies can match.
type Conn struct {
	SrcIP   netip.Addr
	DstIP   netip.Addr
	DstPort uint16
	// SrcIdentity is the peer's SPIFFE URI; "" for plaintext.
	SrcIdentity string
}
