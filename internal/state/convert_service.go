package state

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

func convertService(name string, pb *workloadpb.Service) (*Service, *problem) {
	if pb.GetNamespace() == "" {
		return nil, fail(ReasonMissingField, " namespace")
	}
	if pb.GetHostname() == "" {
		return nil, fail(ReasonMissingField, " hostname")
	}
	key := pb.GetNamespace() + "/" + pb.GetHostname()
	if key != name {
		return nil, fail(ReasonNameMismatch, ": namespace/hostname is %q", key)
	}
	s := &Service{
		Name:               pb.GetName(),
		Namespace:          pb.GetNamespace(),
		Hostname:           pb.GetHostname(),
		SubjectAltNames:    slices.Clone(pb.GetSubjectAltNames()),
		Canonical:          pb.GetCanonical(),
		IngressUseWaypoint: pb.GetIngressUseWaypoint(),
		key:                key,
	}
	for i, a := range pb.GetAddresses() {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			return nil, fail(ReasonBadAddress, " vip %d: want 4 or 16 bytes, got %d", i, len(a.GetAddress()))
		}
		// Upstream: a length equal to the address size (or none) is a plain
		// VIP; anything shorter makes a CIDR VIP.
		if a.Length == nil || int(*a.Length) == ip.BitLen() {
			s.VIPs = append(s.VIPs, NetworkAddress{Network: a.GetNetwork(), Addr: ip})
			continue
		}
		if int(*a.Length) > ip.BitLen() {
			return nil, fail(ReasonBadPrefix, " vip %d: length %d exceeds %d", i, *a.Length, ip.BitLen())
		}
		s.CIDRVIPs = append(s.CIDRVIPs, NetworkPrefix{Network: a.GetNetwork(), Prefix: netip.PrefixFrom(ip, int(*a.Length))})
	}
	var p *problem
	if s.Ports, p = convertPorts("ports", pb.GetPorts()); p != nil {
		return nil, p
	}
	if s.Waypoint, p = convertGateway("waypoint", pb.GetWaypoint()); p != nil {
		return nil, p
	}
	for i, ww := range pb.GetWeightedWaypoints() {
		field := fmt.Sprintf("weighted_waypoints[%d]", i)
		g, p := convertGateway(field, ww.GetDestination())
		if p != nil {
			return nil, p
		}
		if g == nil {
			return nil, fail(ReasonMissingGateway, " %s", field)
		}
		s.WeightedWaypoints = append(s.WeightedWaypoints, WeightedWaypoint{Destination: *g, Weight: ww.GetWeight()})
	}
	if lb := pb.GetLoadBalancing(); lb != nil {
		if s.LoadBalancer, p = convertLoadBalancing(lb); p != nil {
			return nil, p
		}
	}
	switch f := pb.GetIpFamilies(); f {
	case workloadpb.IPFamilies_AUTOMATIC:
	case workloadpb.IPFamilies_IPV4_ONLY:
		s.IPFamilies = IPFamiliesIPv4Only
	case workloadpb.IPFamilies_IPV6_ONLY:
		s.IPFamilies = IPFamiliesIPv6Only
	case workloadpb.IPFamilies_DUAL:
		s.IPFamilies = IPFamiliesDual
	default:
		return nil, unknownEnum("ip_families", int32(f))
	}
	// Unknown visibility values fail open to PUBLIC, as upstream does, so a
	// newer control plane cannot make a service vanish.
	if pb.GetVisibility() == workloadpb.Service_NAMESPACE {
		s.Visibility = VisibilityNamespace
	}
	return s, nil
}

func convertLoadBalancing(lb *workloadpb.LoadBalancing) (*LoadBalancer, *problem) {
	out := &LoadBalancer{}
	for i, sc := range lb.GetRoutingPreference() {
		// UNSPECIFIED_SCOPE is rejected too: upstream has no meaning for it.
		if sc <= workloadpb.LoadBalancing_UNSPECIFIED_SCOPE || sc > workloadpb.LoadBalancing_NETWORK {
			return nil, unknownEnum(fmt.Sprintf("load_balancing.routing_preference[%d]", i), int32(sc))
		}
		// The model's scope numbers follow the proto's (Region = 1 ... Network = 6).
		out.RoutingPreferences = append(out.RoutingPreferences, LBScope(sc))
	}
	switch m := lb.GetMode(); m {
	case workloadpb.LoadBalancing_UNSPECIFIED_MODE:
	case workloadpb.LoadBalancing_STRICT:
		out.Mode = LBStrict
	case workloadpb.LoadBalancing_FAILOVER:
		out.Mode = LBFailover
	case workloadpb.LoadBalancing_PASSTHROUGH:
		out.Mode = LBPassthrough
	default:
		return nil, unknownEnum("load_balancing.mode", int32(m))
	}
	switch h := lb.GetHealthPolicy(); h {
	case workloadpb.LoadBalancing_ONLY_HEALTHY:
	case workloadpb.LoadBalancing_ALLOW_ALL:
		out.HealthPolicy = AllowAll
	default:
		return nil, unknownEnum("load_balancing.health_policy", int32(h))
	}
	return out, nil
}

// convertPolicy validates the fields the store indexes on and hands the
// rest to rbac.Compile. It may return both a policy and an error
// ([ReasonFailClosed]): the resource is reported as rejected and the
// fail-closed policy is applied.
func convertPolicy(name string, a *securitypb.Authorization) (*rbac.Policy, *RejectError) {
	if a == nil {
		return nil, fail(ReasonEmptyResource, ": no authorization").as(kindPolicy, name)
	}
	if a.GetName() == "" {
		return nil, fail(ReasonMissingField, " name").as(kindPolicy, name)
	}
	if a.GetNamespace() == "" {
		return nil, fail(ReasonMissingField, " namespace").as(kindPolicy, name)
	}
	if key := a.GetNamespace() + "/" + a.GetName(); key != name {
		return nil, fail(ReasonNameMismatch, ": namespace/name is %q", key).as(kindPolicy, name)
	}
	if _, ok := securitypb.Scope_name[int32(a.GetScope())]; !ok {
		return nil, unknownEnum("scope", int32(a.GetScope())).as(kindPolicy, name)
	}
	if _, ok := securitypb.Action_name[int32(a.GetAction())]; !ok {
		return nil, unknownEnum("action", int32(a.GetAction())).as(kindPolicy, name)
	}
	pol, err := rbac.Compile(a)
	if err != nil && pol != nil {
		// A malformed entry: rejected (NACK, counter) but enforced fail
		// closed rather than skipped, see rbac.Compile.
		return pol, fail(ReasonFailClosed, ": %v", err).as(kindPolicy, name)
	}
	if err != nil {
		return nil, fail(ReasonInvalidPolicy, ": %v", err).as(kindPolicy, name)
	}
	if pol == nil {
		return nil, fail(ReasonInvalidPolicy, ": compiled to nothing").as(kindPolicy, name)
	}
	return pol, nil
}
