package state

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// Defaults upstream ztunnel fills in when istiod leaves a field empty.
const (
	defaultTrustDomain    = "cluster.local"
	defaultServiceAccount = "default"
	defaultClusterID      = "Kubernetes"
	defaultCapacity       = 1
)

// converted is one valid Address resource: exactly one field is set.
type converted struct {
	workload *Workload
	service  *Service
}

// convertAddress validates one Address resource named name.
func convertAddress(name string, a *workloadpb.Address) (converted, *RejectError) {
	switch t := a.GetType().(type) {
	case *workloadpb.Address_Workload:
		if t.Workload == nil {
			break
		}
		w, p := convertWorkload(name, t.Workload)
		if p != nil {
			return converted{}, p.as(kindWorkload, name)
		}
		return converted{workload: w}, nil
	case *workloadpb.Address_Service:
		if t.Service == nil {
			break
		}
		s, p := convertService(name, t.Service)
		if p != nil {
			return converted{}, p.as(kindService, name)
		}
		return converted{service: s}, nil
	}
	return converted{}, fail(ReasonEmptyResource, ": neither workload nor service").as(kindAddress, name)
}

func convertWorkload(name string, pb *workloadpb.Workload) (*Workload, *problem) {
	if pb.GetUid() == "" {
		return nil, fail(ReasonMissingField, " uid")
	}
	if pb.GetUid() != name {
		return nil, fail(ReasonNameMismatch, ": uid is %q", pb.GetUid())
	}
	if pb.GetNamespace() == "" {
		return nil, fail(ReasonMissingField, " namespace")
	}
	w := &Workload{
		UID:                   pb.GetUid(),
		Name:                  pb.GetName(),
		Namespace:             pb.GetNamespace(),
		Hostname:              pb.GetHostname(),
		Network:               pb.GetNetwork(),
		TrustDomain:           orDefault(pb.GetTrustDomain(), defaultTrustDomain),
		ServiceAccount:        orDefault(pb.GetServiceAccount(), defaultServiceAccount),
		Node:                  pb.GetNode(),
		CanonicalName:         pb.GetCanonicalName(),
		CanonicalRevision:     pb.GetCanonicalRevision(),
		WorkloadName:          pb.GetWorkloadName(),
		NativeTunnel:          pb.GetNativeTunnel(),
		AuthorizationPolicies: slices.Clone(pb.GetAuthorizationPolicies()),
		ClusterID:             orDefault(pb.GetClusterId(), defaultClusterID),
		Capacity:              defaultCapacity,
	}
	if c := pb.GetCapacity(); c != nil {
		w.Capacity = c.GetValue()
	}
	if l := pb.GetLocality(); l != nil {
		w.Locality = Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubzone()}
	}
	if n := len(pb.GetAddresses()); n > 0 {
		w.IPs = make([]netip.Addr, 0, n)
	}
	for i, b := range pb.GetAddresses() {
		ip, ok := netip.AddrFromSlice(b)
		if !ok {
			return nil, fail(ReasonBadAddress, " %d: want 4 or 16 bytes, got %d", i, len(b))
		}
		w.IPs = append(w.IPs, ip)
	}

	switch tp := pb.GetTunnelProtocol(); tp {
	case workloadpb.TunnelProtocol_NONE:
		w.Protocol = ProtocolTCP
	case workloadpb.TunnelProtocol_HBONE:
		w.Protocol = ProtocolHBONE
	case workloadpb.TunnelProtocol_LEGACY_ISTIO_MTLS:
		return nil, fail(ReasonUnsupported, " tunnel_protocol %s", tp)
	default:
		return nil, unknownEnum("tunnel_protocol", int32(tp))
	}
	switch m := pb.GetNetworkMode(); m {
	case workloadpb.NetworkMode_STANDARD:
	case workloadpb.NetworkMode_HOST_NETWORK:
		w.NetworkMode = NetworkModeHostNetwork
	default:
		return nil, unknownEnum("network_mode", int32(m))
	}
	switch st := pb.GetStatus(); st {
	case workloadpb.WorkloadStatus_HEALTHY:
	case workloadpb.WorkloadStatus_UNHEALTHY:
		w.Status = Unhealthy
	default:
		return nil, unknownEnum("status", int32(st))
	}
	wt, known := workloadpb.WorkloadType_name[int32(pb.GetWorkloadType())]
	if !known {
		return nil, unknownEnum("workload_type", int32(pb.GetWorkloadType()))
	}
	w.WorkloadType = strings.ToLower(wt)

	var p *problem
	if w.Waypoint, p = convertGateway("waypoint", pb.GetWaypoint()); p != nil {
		return nil, p
	}
	if w.NetworkGateway, p = convertGateway("network_gateway", pb.GetNetworkGateway()); p != nil {
		return nil, p
	}
	if t := pb.GetApplicationTunnel(); t != nil {
		at := &ApplicationTunnel{}
		switch t.GetProtocol() {
		case workloadpb.ApplicationTunnel_NONE:
		case workloadpb.ApplicationTunnel_PROXY:
			at.Protocol = AppTunnelProxy
		default:
			return nil, unknownEnum("application_tunnel.protocol", int32(t.GetProtocol()))
		}
		if t.GetPort() > maxPort {
			return nil, fail(ReasonBadPort, " application_tunnel.port %d: want 0-65535", t.GetPort())
		}
		at.Port = uint16(t.GetPort())
		w.ApplicationTunnel = at
	}
	if w.Services, p = convertWorkloadServices(pb.GetServices()); p != nil {
		return nil, p
	}
	return w, nil
}

// convertWorkloadServices validates the services map in key order so the
// reported problem does not depend on map iteration.
func convertWorkloadServices(in map[string]*workloadpb.PortList) (map[string]PortMap, *problem) {
	if len(in) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(in))
	for k := range in {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(map[string]PortMap, len(in))
	for _, k := range keys {
		if _, ok := splitServiceKey(k); !ok {
			return nil, fail(ReasonBadServiceKey, " %q: want namespace/hostname", k)
		}
		pm, p := convertPorts("services["+strconv.Quote(k)+"]", in[k].GetPorts())
		if p != nil {
			return nil, p
		}
		out[k] = pm
	}
	return out, nil
}

// maxPort is the largest TCP port; proto fields are uint32.
const maxPort = 65535

// convertPorts validates a port list: service ports 1-65535, targets
// 0-65535 (0 = unset).
func convertPorts(where string, ports []*workloadpb.Port) (PortMap, *problem) {
	pm := make(PortMap, len(ports))
	for i, pt := range ports {
		sp, tp := pt.GetServicePort(), pt.GetTargetPort()
		if sp == 0 || sp > maxPort {
			return nil, fail(ReasonBadPort, " %s[%d].service_port %d: want 1-65535", where, i, sp)
		}
		if tp > maxPort {
			return nil, fail(ReasonBadPort, " %s[%d].target_port %d: want 0-65535", where, i, tp)
		}
		pm[uint16(sp)] = uint16(tp)
	}
	return pm, nil
}

// convertGateway converts an optional gateway; nil in → nil out.
func convertGateway(field string, g *workloadpb.GatewayAddress) (*GatewayAddress, *problem) {
	if g == nil {
		return nil, nil
	}
	if g.GetHboneMtlsPort() > maxPort {
		return nil, fail(ReasonBadPort, " %s.hbone_mtls_port %d: want 0-65535", field, g.GetHboneMtlsPort())
	}
	out := &GatewayAddress{HBONEPort: uint16(g.GetHboneMtlsPort())}
	switch d := g.GetDestination().(type) {
	case *workloadpb.GatewayAddress_Hostname:
		if d.Hostname == nil {
			break
		}
		out.Hostname = &NamespacedHostname{Namespace: d.Hostname.GetNamespace(), Hostname: d.Hostname.GetHostname()}
		return out, nil
	case *workloadpb.GatewayAddress_Address:
		if d.Address == nil {
			break
		}
		ip, ok := netip.AddrFromSlice(d.Address.GetAddress())
		if !ok {
			return nil, fail(ReasonBadAddress, " %s: want 4 or 16 bytes, got %d", field, len(d.Address.GetAddress()))
		}
		out.Address = &NetworkAddress{Network: d.Address.GetNetwork(), Addr: ip}
		return out, nil
	}
	return nil, fail(ReasonMissingGateway, " %s", field)
}

func unknownEnum(field string, v int32) *problem {
	return fail(ReasonUnknownEnum, " %s %d", field, v)
}

// splitServiceKey parses "namespace/hostname" at the first slash; both parts
// must be non-empty.
func splitServiceKey(k string) (NamespacedHostname, bool) {
	ns, host, ok := strings.Cut(k, "/")
	if !ok || ns == "" || host == "" {
		return NamespacedHostname{}, false
	}
	return NamespacedHostname{Namespace: ns, Hostname: host}, true
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
