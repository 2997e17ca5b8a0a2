package state

import (
	"fmt"
	"strings"
)

// Reason names why a resource was rejected. Its value is the phrase used in
// the error text; [Reason.Label] is the same phrase in the form used as a
// metric label.
type Reason string

const (
	// ReasonMissingField: a field the data path keys on (uid, namespace,
	// hostname, name) is empty.
	ReasonMissingField Reason = "missing field"
	// ReasonNameMismatch: the xDS resource name is not the one istiod derives
	// from the content (uid, namespace/hostname, namespace/name); accepting it
	// would make a later removal by name miss.
	ReasonNameMismatch Reason = "name mismatch"
	// ReasonBadAddress: IP bytes that are neither 4 nor 16 long.
	ReasonBadAddress Reason = "bad address"
	// ReasonBadPrefix: a prefix length longer than the address.
	ReasonBadPrefix Reason = "bad prefix"
	// ReasonUnknownEnum: an enum number not in the enum (proto3 keeps unknown
	// numbers, so a newer control plane can send them).
	ReasonUnknownEnum Reason = "unknown enum"
	// ReasonUnsupported: a known value this ztunnel does not implement
	// (LEGACY_ISTIO_MTLS), rejected like upstream does.
	ReasonUnsupported Reason = "unsupported"
	// ReasonBadPort: a port above 65535, or 0 where a port is required.
	ReasonBadPort Reason = "bad port"
	// ReasonBadServiceKey: a workload's services key that is not
	// "namespace/hostname".
	ReasonBadServiceKey Reason = "bad service key"
	// ReasonMissingGateway: a waypoint or network gateway with neither an
	// address nor a hostname.
	ReasonMissingGateway Reason = "missing gateway destination"
	// ReasonEmptyResource: a nil resource, or an Address with neither a
	// workload nor a service.
	ReasonEmptyResource Reason = "empty resource"
	// ReasonInvalidPolicy: rbac.Compile refused the Authorization.
	ReasonInvalidPolicy Reason = "invalid policy"
	// ReasonFailClosed: rbac.Compile found a malformed entry (bad CIDR or
	// port); the resource is reported rejected (NACK) but its fail-closed
	// form is enforced, so a DENY is never skipped (istio/istio#61126).
	ReasonFailClosed Reason = "enforced fail closed"
)

// Label is the reason as a metric label value: the phrase with spaces
// replaced by underscores ("bad address" → "bad_address").
func (r Reason) Label() string { return strings.ReplaceAll(string(r), " ", "_") }

// Kinds of resource named in a RejectError and in the metric's type label.
const (
	kindWorkload = "workload"
	kindService  = "service"
	kindPolicy   = "policy"
	kindAddress  = "address" // an Address whose type could not be told
)

// RejectError is why one resource was rejected. Error() reads
//
//	state: workload "uid": bad address 2: want 4 or 16 bytes, got 3
type RejectError struct {
	// Kind is "workload", "service", "policy" or "address".
	Kind string
	// Name is the xDS resource name.
	Name   string
	Reason Reason
	// Detail follows the reason phrase in the message (it starts with the
	// separator, e.g. " 2: want 4 or 16 bytes, got 3").
	Detail string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("state: %s %q: %s%s", e.Kind, e.Name, e.Reason, e.Detail)
}

// problem is a rejection before the kind and name are attached.
type problem struct {
	reason Reason
	detail string
}

func fail(r Reason, format string, args ...any) *problem {
	return &problem{reason: r, detail: fmt.Sprintf(format, args...)}
}

func (p *problem) as(kind, name string) *RejectError {
	return &RejectError{Kind: kind, Name: name, Reason: p.reason, Detail: p.detail}
}
