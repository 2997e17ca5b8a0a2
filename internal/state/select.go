package state

import (
	"math/rand/v2"
	"net/netip"
)

// ResolutionMode says why an endpoint of a service is being picked.
type ResolutionMode uint8

const (
	// ResolveStandard: a client connects to a service port, which must be
	// one of the service's ports.
	ResolveStandard ResolutionMode = iota
	// ResolveWaypoint: ztunnel reaches a waypoint at its HBONE port, which
	// need not be a service port; an endpoint without it still qualifies if
	// it runs an application tunnel.
	ResolveWaypoint
)

// Rand returns a uniformly random number in [0, n) for n > 0. Nil means
// math/rand/v2's global source. Tests pass a fixed one.
type Rand func(n uint64) uint64

func (r Rand) pick(n uint64) uint64 {
	if r == nil {
		return rand.Uint64N(n)
	}
	return r(n)
}

// Upstream is where a connection goes after service resolution.
type Upstream struct {
	// Workload is the chosen destination; nil when Passthrough.
	Workload *Workload
	// Port is the port on Workload to connect to.
	Port uint16
	// Service is the service the destination was chosen from; nil when the
	// destination was addressed directly.
	Service *Service
	// Passthrough: the service's load balancing mode is PASSTHROUGH, so the
	// connection goes to the original destination unchanged.
	Passthrough bool
}

// FindUpstream resolves dst, as seen from the workload src in network: a
// service VIP first (picking one endpoint), then a workload address.
// src may be nil when the source is unknown.
func (s *Snapshot) FindUpstream(src *Workload, network string, dst netip.AddrPort, mode ResolutionMode, rnd Rand) (Upstream, bool) {
	src = orNobody(src)
	if svc := s.ServiceByVIP(network, dst.Addr(), src.Namespace); svc != nil {
		if svc.LoadBalancer != nil && svc.LoadBalancer.Mode == LBPassthrough {
			return Upstream{Service: svc, Passthrough: true}, true
		}
		return s.UpstreamFromService(src, svc, dst.Port(), mode, rnd)
	}
	if w := s.WorkloadByAddr(network, dst.Addr()); w != nil {
		return Upstream{Workload: w, Port: dst.Port()}, true
	}
	return Upstream{}, false
}

// UpstreamFromService picks one endpoint of svc for svcPort and resolves
// the port to use on it (see Endpoint.TargetPort).
func (s *Snapshot) UpstreamFromService(src *Workload, svc *Service, svcPort uint16, mode ResolutionMode, rnd Rand) (Upstream, bool) {
	ep := s.PickEndpoint(orNobody(src), svc, svcPort, mode, rnd)
	if ep == nil {
		return Upstream{}, false
	}
	port, ok := ep.TargetPort(svc, svcPort)
	if !ok {
		return Upstream{}, false
	}
	return Upstream{Workload: ep.Workload, Port: port, Service: svc}, true
}

// PickEndpoint chooses one endpoint of svc for a connection from src to
// svcPort, or returns nil. As upstream: endpoints that cannot serve the
// port, or that have no address and cannot be reached through a network
// gateway, are skipped; with a Strict or Failover load balancer only the
// endpoints best matching src's locality are candidates (Strict: only those
// matching every preference); the choice among candidates is random,
// weighted by capacity.
func (s *Snapshot) PickEndpoint(src *Workload, svc *Service, svcPort uint16, mode ResolutionMode, rnd Rand) *Endpoint {
	src = orNobody(src)
	target, hasPort := svc.Ports[svcPort]
	if mode == ResolveStandard && !hasPort {
		return nil
	}
	c := candidacy{src: src, svcPort: svcPort, target: target, hasPort: hasPort, mode: mode, lb: svc.LoadBalancer}
	eps := s.Endpoints(svc)
	// Two passes and one random draw, allocating nothing: first find the
	// best rank and the total capacity at that rank, then walk to the draw.
	best, total := -1, uint64(0)
	for _, ep := range eps {
		rank, ok := c.rank(ep)
		switch {
		case !ok || rank < best:
		case rank > best:
			best, total = rank, uint64(ep.Workload.Capacity)
		default:
			total += uint64(ep.Workload.Capacity)
		}
	}
	if total == 0 {
		return nil
	}
	n := rnd.pick(total)
	for _, ep := range eps {
		if rank, ok := c.rank(ep); !ok || rank != best {
			continue
		}
		capacity := uint64(ep.Workload.Capacity)
		if n < capacity {
			return ep
		}
		n -= capacity
	}
	return nil // not reached: the draw is below the total
}

// candidacy decides whether an endpoint can take a connection and how well
// it matches the source's locality.
type candidacy struct {
	src     *Workload
	svcPort uint16
	target  uint16
	hasPort bool
	mode    ResolutionMode
	lb      *LoadBalancer
}

func (c *candidacy) rank(ep *Endpoint) (int, bool) {
	w := ep.Workload
	if len(w.IPs) == 0 && w.Hostname == "" && (w.Network == c.src.Network || w.NetworkGateway == nil) {
		return 0, false // only reachable through a gateway, and there is none to use
	}
	switch c.mode {
	case ResolveStandard:
		if c.target == 0 {
			if _, listed := ep.Ports[c.svcPort]; !listed {
				return 0, false
			}
		}
	case ResolveWaypoint:
		if !c.hasPort && w.ApplicationTunnel == nil {
			return 0, false
		}
	}
	if c.lb == nil || c.lb.Mode == LBStandard {
		return 0, true
	}
	return localityRank(c.lb, c.src, w)
}

// localityRank scores how well w matches src under lb's routing
// preferences, following upstream: count the leading preferences that
// match; when Network is the first preference and matches, it counts as
// matching all but itself (so in-network endpoints outrank others); Strict
// drops endpoints that do not match them all.
func localityRank(lb *LoadBalancer, src, w *Workload) (int, bool) {
	prefs := lb.RoutingPreferences
	networkFirst := len(prefs) > 0 && prefs[0] == LBScopeNetwork
	rank, adjust := 0, 0
	for _, p := range prefs {
		var match bool
		switch p {
		case LBScopeRegion:
			match = src.Locality.Region == w.Locality.Region
		case LBScopeZone:
			match = src.Locality.Zone == w.Locality.Zone
		case LBScopeSubzone:
			match = src.Locality.Subzone == w.Locality.Subzone
		case LBScopeNode:
			match = src.Node == w.Node
		case LBScopeCluster:
			match = src.ClusterID == w.ClusterID
		case LBScopeNetwork:
			match = src.Network == w.Network
			if networkFirst {
				if !match {
					continue // judge the remaining scopes on their own
				}
				adjust = len(prefs) - 1
			}
		}
		if !match {
			break
		}
		rank++
	}
	if lb.Mode == LBStrict && rank != len(prefs) {
		return 0, false
	}
	return rank + adjust, true
}

// ResolveGateway resolves a waypoint or network gateway for a connection
// from src. An address destination is looked up like any destination (at
// g.HBONEPort); a hostname one finds the service (then one endpoint) or a
// workload with that hostname. The caller connects to Upstream.Port.
func (s *Snapshot) ResolveGateway(src *Workload, g *GatewayAddress, mode ResolutionMode, rnd Rand) (Upstream, bool) {
	switch {
	case g == nil:
		return Upstream{}, false
	case g.Address != nil:
		return s.FindUpstream(src, g.Address.Network, netip.AddrPortFrom(g.Address.Addr, g.HBONEPort), mode, rnd)
	case g.Hostname != nil:
		a := s.FindHostname(*g.Hostname)
		if a.Service != nil {
			return s.UpstreamFromService(src, a.Service, g.HBONEPort, mode, rnd)
		}
		if a.Workload != nil {
			return Upstream{Workload: a.Workload, Port: g.HBONEPort}, true
		}
	}
	return Upstream{}, false
}

// PickWaypoint returns the waypoint for a connection to s: one of the
// weighted waypoints chosen by weight when there are any with weight, else
// s.Waypoint (nil when the service has none).
func (s *Service) PickWaypoint(rnd Rand) *GatewayAddress {
	var total uint64
	for _, ww := range s.WeightedWaypoints {
		total += uint64(ww.Weight)
	}
	if total == 0 {
		return s.Waypoint
	}
	n := rnd.pick(total)
	for i := range s.WeightedWaypoints {
		ww := &s.WeightedWaypoints[i]
		if n < uint64(ww.Weight) {
			return &ww.Destination
		}
		n -= uint64(ww.Weight)
	}
	return s.Waypoint // not reached
}

// PickIP chooses which of w's IPs to connect to for a connection originally
// addressed to requested: requested itself if it is w's; otherwise the
// first IP allowed by families of the same family as requested, or the first
// allowed one. ok is false when none is allowed (the caller may then resolve
// w.Hostname or use w.NetworkGateway).
func (w *Workload) PickIP(requested netip.Addr, families IPFamilies) (ip netip.Addr, ok bool) {
	if w.HasIP(requested) {
		return requested, true
	}
	for _, a := range w.IPs {
		if !families.Accepts(a) {
			continue
		}
		if a.Is6() == requested.Is6() {
			return a, true
		}
		if !ok {
			ip, ok = a, true
		}
	}
	return ip, ok
}

// nobody stands in for an unknown source workload: it matches no locality,
// namespace or network other than the defaults.
var nobody = &Workload{}

func orNobody(w *Workload) *Workload {
	if w == nil {
		return nobody
	}
	return w
}
