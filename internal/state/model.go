package state

import (
	"net/netip"
	"strconv"
)

// Every model value is immutable once it is in a published Snapshot: the
// data path shares pointers to them across goroutines without copying.

// InboundProtocol is how a workload accepts inbound traffic.
type InboundProtocol uint8

const (
	// ProtocolTCP: plain TCP to the workload's port (tunnel_protocol NONE).
	ProtocolTCP InboundProtocol = iota
	// ProtocolHBONE: a ztunnel serves the workload on port 15008.
	ProtocolHBONE
)

func (p InboundProtocol) String() string {
	if p == ProtocolHBONE {
		return "HBONE"
	}
	return "TCP"
}

// NetworkMode says whether the workload shares its node's network namespace.
type NetworkMode uint8

const (
	NetworkModeStandard NetworkMode = iota
	// NetworkModeHostNetwork workloads share the node's IPs, so they are not
	// indexed by address (upstream does the same).
	NetworkModeHostNetwork
)

func (m NetworkMode) String() string {
	if m == NetworkModeHostNetwork {
		return "HostNetwork"
	}
	return "Standard"
}

// HealthStatus is a workload's readiness as the control plane sees it.
type HealthStatus uint8

const (
	Healthy HealthStatus = iota
	Unhealthy
)

func (h HealthStatus) String() string {
	if h == Unhealthy {
		return "Unhealthy"
	}
	return "Healthy"
}

// AppTunnelProtocol is the protocol of a workload's application tunnel.
type AppTunnelProtocol uint8

const (
	AppTunnelNone AppTunnelProtocol = iota
	AppTunnelProxy
)

func (p AppTunnelProtocol) String() string {
	if p == AppTunnelProxy {
		return "PROXY"
	}
	return "NONE"
}

// ApplicationTunnel says the workload itself terminates a tunnel.
type ApplicationTunnel struct {
	Protocol AppTunnelProtocol
	// Port is 0 when unset.
	Port uint16
}

// NetworkAddress is an IP scoped to a network ("" is the default network).
type NetworkAddress struct {
	Network string
	Addr    netip.Addr
}

// String is "network/ip", the form upstream uses in config_dump.
func (a NetworkAddress) String() string { return a.Network + "/" + a.Addr.String() }

// NetworkPrefix is a CIDR VIP scoped to a network.
type NetworkPrefix struct {
	Network string
	Prefix  netip.Prefix
}

// NamespacedHostname names a service.
type NamespacedHostname struct {
	Namespace string
	Hostname  string
}

// String is "namespace/hostname", the form used as a key everywhere.
func (n NamespacedHostname) String() string { return n.Namespace + "/" + n.Hostname }

// GatewayAddress locates a waypoint or network gateway. Exactly one of
// Hostname and Address is set.
type GatewayAddress struct {
	Hostname *NamespacedHostname
	Address  *NetworkAddress
	// HBONEPort is the port the gateway serves HBONE on (istiod sends 15008).
	HBONEPort uint16
}

// Destination is the gateway as upstream's config_dump prints it:
// "namespace/hostname" or "network/ip".
func (g *GatewayAddress) Destination() string {
	if g.Hostname != nil {
		return g.Hostname.String()
	}
	if g.Address != nil {
		return g.Address.String()
	}
	return ""
}

// Locality is where a workload runs.
type Locality struct {
	Region, Zone, Subzone string
}

// PortMap maps a service port to a target port.
type PortMap map[uint16]uint16

// Workload is one addressable instance: a pod, a VM, a WorkloadEntry.
type Workload struct {
	UID       string
	Name      string
	Namespace string
	// IPs are the workload's addresses in Network; empty for a workload known
	// only by Hostname or reachable only through a network gateway.
	IPs      []netip.Addr
	Hostname string
	Network  string
	Protocol InboundProtocol
	// TrustDomain and ServiceAccount with Namespace make the SPIFFE identity.
	TrustDomain       string
	ServiceAccount    string
	Waypoint          *GatewayAddress
	NetworkGateway    *GatewayAddress
	Node              string
	CanonicalName     string
	CanonicalRevision string
	// WorkloadType is lower case: deployment, cronjob, pod or job.
	WorkloadType      string
	WorkloadName      string
	NativeTunnel      bool
	ApplicationTunnel *ApplicationTunnel
	// Services maps "namespace/hostname" of each service this workload backs
	// to its port map (service port → port on this workload).
	Services map[string]PortMap
	// AuthorizationPolicies are "namespace/name" keys of policies selected for
	// this workload by the control plane.
	AuthorizationPolicies []string
	Status                HealthStatus
	ClusterID             string
	Locality              Locality
	NetworkMode           NetworkMode
	// Capacity weighs this workload in endpoint selection.
	Capacity uint32
}

// SPIFFEID is the workload's identity URI.
func (w *Workload) SPIFFEID() string {
	return "spiffe://" + w.TrustDomain + "/ns/" + w.Namespace + "/sa/" + w.ServiceAccount
}

// HasIP reports whether ip is one of the workload's addresses.
func (w *Workload) HasIP(ip netip.Addr) bool {
	for _, a := range w.IPs {
		if a == ip {
			return true
		}
	}
	return false
}

// LoadBalancerMode is how routing preferences constrain endpoint choice.
type LoadBalancerMode uint8

const (
	// LBStandard ignores routing preferences (UNSPECIFIED_MODE).
	LBStandard LoadBalancerMode = iota
	// LBStrict only picks endpoints that match every preference.
	LBStrict
	// LBFailover prefers the best-matching endpoints but takes any.
	LBFailover
	// LBPassthrough skips endpoint selection: traffic goes to the original
	// destination address.
	LBPassthrough
)

func (m LoadBalancerMode) String() string {
	switch m {
	case LBStrict:
		return "Strict"
	case LBFailover:
		return "Failover"
	case LBPassthrough:
		return "Passthrough"
	}
	return "Standard"
}

// LBScope is one routing preference.
type LBScope uint8

const (
	LBScopeRegion LBScope = iota + 1
	LBScopeZone
	LBScopeSubzone
	LBScopeNode
	LBScopeCluster
	LBScopeNetwork
)

func (s LBScope) String() string {
	switch s {
	case LBScopeRegion:
		return "Region"
	case LBScopeZone:
		return "Zone"
	case LBScopeSubzone:
		return "Subzone"
	case LBScopeNode:
		return "Node"
	case LBScopeCluster:
		return "Cluster"
	case LBScopeNetwork:
		return "Network"
	}
	return "LBScope(" + strconv.Itoa(int(s)) + ")"
}

// HealthPolicy says whether unhealthy workloads are endpoints.
type HealthPolicy uint8

const (
	OnlyHealthy HealthPolicy = iota
	AllowAll
)

func (h HealthPolicy) String() string {
	if h == AllowAll {
		return "AllowAll"
	}
	return "OnlyHealthy"
}

// LoadBalancer is a service's endpoint-selection policy.
type LoadBalancer struct {
	RoutingPreferences []LBScope
	Mode               LoadBalancerMode
	HealthPolicy       HealthPolicy
}

// IPFamilies restricts which of a workload's IPs a service may use.
type IPFamilies uint8

const (
	// IPFamiliesAutomatic: no restriction.
	IPFamiliesAutomatic IPFamilies = iota
	IPFamiliesIPv4Only
	IPFamiliesIPv6Only
	IPFamiliesDual
)

// String is upstream's dump name; "" for automatic (upstream omits it).
func (f IPFamilies) String() string {
	switch f {
	case IPFamiliesIPv4Only:
		return "IPv4"
	case IPFamiliesIPv6Only:
		return "IPv6"
	case IPFamiliesDual:
		return "Dual"
	}
	return ""
}

// Accepts reports whether ip is allowed by the restriction.
func (f IPFamilies) Accepts(ip netip.Addr) bool {
	switch f {
	case IPFamiliesIPv4Only:
		return ip.Is4()
	case IPFamiliesIPv6Only:
		return ip.Is6()
	}
	return true
}

// Visibility is who may resolve a service.
type Visibility uint8

const (
	// VisibilityPublic: every client.
	VisibilityPublic Visibility = iota
	// VisibilityNamespace: only clients in the service's namespace.
	VisibilityNamespace
)

func (v Visibility) String() string {
	if v == VisibilityNamespace {
		return "Namespace"
	}
	return "Public"
}

// WeightedWaypoint is one candidate of a service's weighted waypoint set.
type WeightedWaypoint struct {
	Destination GatewayAddress
	Weight      uint32
}

// Service is a set of workloads reachable by VIPs and/or hostname.
type Service struct {
	Name      string
	Namespace string
	Hostname  string
	VIPs      []NetworkAddress
	// CIDRVIPs are VIPs sent with a prefix length shorter than the address.
	CIDRVIPs []NetworkPrefix
	// Ports maps service port → target port; a target of 0 means "the port
	// each endpoint lists for this service".
	Ports              PortMap
	SubjectAltNames    []string
	Waypoint           *GatewayAddress
	WeightedWaypoints  []WeightedWaypoint
	LoadBalancer       *LoadBalancer
	IPFamilies         IPFamilies
	Canonical          bool
	IngressUseWaypoint bool
	Visibility         Visibility

	key string // Namespace + "/" + Hostname, built once at conversion
}

// Key is "namespace/hostname", the service's xDS resource name.
func (s *Service) Key() string {
	if s.key == "" {
		return s.Namespace + "/" + s.Hostname
	}
	return s.key
}

// VisibleTo reports whether a client in namespace ns may resolve s; ns ""
// means no client namespace is known and everything is visible.
func (s *Service) VisibleTo(ns string) bool {
	return ns == "" || s.Visibility != VisibilityNamespace || s.Namespace == ns
}

// IncludesUnhealthy reports whether unhealthy workloads count as endpoints.
func (s *Service) IncludesUnhealthy() bool {
	return s.LoadBalancer != nil && s.LoadBalancer.HealthPolicy == AllowAll
}

// Endpoint is a workload backing a service.
type Endpoint struct {
	Workload *Workload
	// Ports is the workload's port map for this service.
	Ports PortMap
}

// TargetPort resolves which port on this endpoint serves svcPort of svc:
// the endpoint's own mapping first, then the service's target port, and,
// for a workload with an application tunnel port, svcPort itself. ok is
// false when none applies. A mapping of 0 counts as unset.
func (e *Endpoint) TargetPort(svc *Service, svcPort uint16) (port uint16, ok bool) {
	if p := e.Ports[svcPort]; p != 0 {
		return p, true
	}
	if p := svc.Ports[svcPort]; p != 0 {
		return p, true
	}
	if t := e.Workload.ApplicationTunnel; t != nil && t.Port != 0 {
		return svcPort, true
	}
	return 0, false
}

// Address is what an address or hostname resolved to: a workload or a
// service (at most one is set; both nil means not found).
type Address struct {
	Workload *Workload
	Service  *Service
}

// Found reports whether the lookup found anything.
func (a Address) Found() bool { return a.Workload != nil || a.Service != nil }
