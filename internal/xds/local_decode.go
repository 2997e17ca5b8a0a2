package xds

// Decoding of a local config's workloads and services, field names and
// enum spellings as upstream ztunnel's serde types (camelCase; enums by
// their Rust variant names).

import (
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"

	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

func (d *decoder) workload(n *yaml.Node, path string) (*workloadpb.Workload, error) {
	w := &workloadpb.Workload{}
	set := map[string]bool{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		set[key] = true
		var err error
		switch key {
		case "uid":
			w.Uid, err = d.str(v, p)
		case "name":
			w.Name, err = d.str(v, p)
		case "namespace":
			w.Namespace, err = d.str(v, p)
		case "hostname":
			w.Hostname, err = d.str(v, p)
		case "network":
			w.Network, err = d.str(v, p)
		case "trustDomain":
			w.TrustDomain, err = d.str(v, p)
		case "serviceAccount":
			w.ServiceAccount, err = d.str(v, p)
		case "node":
			w.Node, err = d.str(v, p)
		case "canonicalName":
			w.CanonicalName, err = d.str(v, p)
		case "canonicalRevision":
			w.CanonicalRevision, err = d.str(v, p)
		case "workloadName":
			w.WorkloadName, err = d.str(v, p)
		case "clusterId":
			w.ClusterId, err = d.str(v, p)
		case "workloadType":
			// Upstream keeps the lower-cased proto name as a string.
			var i int
			i, err = d.enum(v, p, "workloadType", "deployment", "cronjob", "pod", "job")
			w.WorkloadType = []workloadpb.WorkloadType{workloadpb.WorkloadType_DEPLOYMENT,
				workloadpb.WorkloadType_CRONJOB, workloadpb.WorkloadType_POD, workloadpb.WorkloadType_JOB}[i]
		case "workloadIps":
			err = d.seq(v, p, func(item *yaml.Node, ip string) error {
				a, err := d.ip(item, ip)
				w.Addresses = append(w.Addresses, a.AsSlice())
				return err
			})
		case "protocol":
			var i int
			i, err = d.enum(v, p, "protocol", "TCP", "HBONE")
			w.TunnelProtocol = []workloadpb.TunnelProtocol{workloadpb.TunnelProtocol_NONE, workloadpb.TunnelProtocol_HBONE}[i]
		case "networkMode":
			var i int
			i, err = d.enum(v, p, "networkMode", "Standard", "HostNetwork")
			w.NetworkMode = workloadpb.NetworkMode(i)
		case "status":
			var i int
			i, err = d.enum(v, p, "status", "Healthy", "Unhealthy")
			w.Status = workloadpb.WorkloadStatus(i)
		case "waypoint":
			w.Waypoint, err = d.gateway(v, p)
		case "networkGateway":
			w.NetworkGateway, err = d.gateway(v, p)
		case "nativeTunnel":
			w.NativeTunnel, err = d.boolean(v, p)
		case "applicationTunnel":
			w.ApplicationTunnel, err = d.appTunnel(v, p)
		case "authorizationPolicies":
			w.AuthorizationPolicies, err = d.strs(v, p)
		case "locality":
			w.Locality, err = d.locality(v, p)
		case "capacity":
			var c uint64
			c, err = d.uint(v, p, 1<<32-1, false)
			w.Capacity = wrapperspb.UInt32(uint32(c))
		case "services":
			w.Services, err = d.workloadServices(v, p)
		default:
			return errUnknownField
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := d.require(n, path, set, "uid", "namespace"); err != nil {
		return nil, err
	}
	return w, nil
}

// workloadServices reads {"namespace/hostname": {servicePort: targetPort}}.
func (d *decoder) workloadServices(n *yaml.Node, path string) (map[string]*workloadpb.PortList, error) {
	out := map[string]*workloadpb.PortList{}
	err := d.entries(n, path, func(k, v *yaml.Node, p string) error {
		ns, host, ok := strings.Cut(k.Value, "/")
		if !ok || ns == "" || host == "" {
			return d.errf(k, path, "service %q: want namespace/hostname", k.Value)
		}
		ports, err := d.portMap(v, p)
		out[k.Value] = &workloadpb.PortList{Ports: ports}
		return err
	})
	return out, err
}

// portMap reads {servicePort: targetPort}, sorted by service port.
func (d *decoder) portMap(n *yaml.Node, path string) ([]*workloadpb.Port, error) {
	var out []*workloadpb.Port
	err := d.entries(n, path, func(k, v *yaml.Node, p string) error {
		sp, err := d.port(k, path, false, true)
		if err != nil {
			return err
		}
		tp, err := d.port(v, p, true, false)
		out = append(out, &workloadpb.Port{ServicePort: sp, TargetPort: tp})
		return err
	})
	slices.SortFunc(out, func(a, b *workloadpb.Port) int { return int(a.ServicePort) - int(b.ServicePort) })
	return out, err
}

func (d *decoder) appTunnel(n *yaml.Node, path string) (*workloadpb.ApplicationTunnel, error) {
	t := &workloadpb.ApplicationTunnel{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		var err error
		switch key {
		case "protocol":
			var i int
			i, err = d.enum(v, p, "protocol", "NONE", "PROXY")
			t.Protocol = workloadpb.ApplicationTunnel_Protocol(i)
		case "port":
			if isNull(v) {
				return nil
			}
			t.Port, err = d.port(v, p, true, false)
		default:
			return errUnknownField
		}
		return err
	})
	return t, err
}

func (d *decoder) locality(n *yaml.Node, path string) (*workloadpb.Locality, error) {
	l := &workloadpb.Locality{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		var err error
		switch key {
		case "region":
			l.Region, err = d.str(v, p)
		case "zone":
			l.Zone, err = d.str(v, p)
		case "subzone":
			l.Subzone, err = d.str(v, p)
		default:
			return errUnknownField
		}
		return err
	})
	return l, err
}

// gateway reads {destination: "network/ip" | "namespace/hostname",
// hboneMtlsPort: N}. As upstream, a destination whose part after the first
// slash is an IP is an address; anything else with a slash is a hostname.
func (d *decoder) gateway(n *yaml.Node, path string) (*workloadpb.GatewayAddress, error) {
	g := &workloadpb.GatewayAddress{}
	set := map[string]bool{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		set[key] = true
		switch key {
		case "destination":
			s, err := d.str(v, p)
			if err != nil {
				return err
			}
			before, after, ok := strings.Cut(s, "/")
			if !ok || after == "" {
				return d.errf(v, p, "%q: want network/IP or namespace/hostname", s)
			}
			if ip, err := netip.ParseAddr(after); err == nil && ip.Zone() == "" {
				g.Destination = &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{Network: before, Address: ip.AsSlice()}}
			} else {
				g.Destination = &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{Namespace: before, Hostname: after}}
			}
			return nil
		case "hboneMtlsPort":
			var err error
			g.HboneMtlsPort, err = d.port(v, p, false, false)
			return err
		}
		return errUnknownField
	})
	if err != nil {
		return nil, err
	}
	if err := d.require(n, path, set, "destination"); err != nil {
		return nil, err
	}
	if !set["hboneMtlsPort"] {
		g.HboneMtlsPort = 15008 // the HBONE port; upstream requires the field, we default it
	}
	return g, nil
}

func (d *decoder) service(n *yaml.Node, path string) (*workloadpb.Service, error) {
	s := &workloadpb.Service{}
	set := map[string]bool{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		set[key] = true
		var err error
		switch key {
		case "name":
			s.Name, err = d.str(v, p)
		case "namespace":
			s.Namespace, err = d.str(v, p)
		case "hostname":
			s.Hostname, err = d.str(v, p)
		case "vips":
			err = d.seq(v, p, func(item *yaml.Node, ip string) error {
				a, err := d.networkAddr(item, ip)
				s.Addresses = append(s.Addresses, a)
				return err
			})
		case "cidrVips":
			err = d.seq(v, p, func(item *yaml.Node, ip string) error {
				a, err := d.cidrVIP(item, ip)
				s.Addresses = append(s.Addresses, a)
				return err
			})
		case "ports":
			s.Ports, err = d.portMap(v, p)
		case "subjectAltNames":
			s.SubjectAltNames, err = d.strs(v, p)
		case "waypoint":
			s.Waypoint, err = d.gateway(v, p)
		case "weightedWaypoints":
			err = d.seq(v, p, func(item *yaml.Node, ip string) error {
				ww, err := d.weightedWaypoint(item, ip)
				s.WeightedWaypoints = append(s.WeightedWaypoints, ww)
				return err
			})
		case "loadBalancer":
			s.LoadBalancing, err = d.loadBalancer(v, p)
		case "ipFamilies":
			var i int
			i, err = d.enum(v, p, "ipFamilies", "IPv4", "IPv6", "Dual")
			s.IpFamilies = []workloadpb.IPFamilies{workloadpb.IPFamilies_IPV4_ONLY, workloadpb.IPFamilies_IPV6_ONLY, workloadpb.IPFamilies_DUAL}[i]
		case "canonical":
			s.Canonical, err = d.boolean(v, p)
		case "visibility":
			var i int
			i, err = d.enum(v, p, "visibility", "Public", "Namespace")
			s.Visibility = workloadpb.Service_Visibility(i)
		case "endpoints":
			// Upstream accepts explicit endpoints; here they always come from
			// the workloads' services maps, as they do over xDS.
			return d.errf(v, p, "not supported: list the service under each workload's services instead")
		default:
			return errUnknownField
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := d.require(n, path, set, "namespace", "hostname"); err != nil {
		return nil, err
	}
	return s, nil
}

// networkAddr reads "network/ip" (the network may be empty: "/10.0.0.1").
func (d *decoder) networkAddr(n *yaml.Node, path string) (*workloadpb.NetworkAddress, error) {
	s, err := d.str(n, path)
	if err != nil {
		return nil, err
	}
	network, addr, ok := strings.Cut(s, "/")
	ip, perr := netip.ParseAddr(addr)
	if !ok || perr != nil || ip.Zone() != "" {
		return nil, d.errf(n, path, "%q: want network/IP", s)
	}
	return &workloadpb.NetworkAddress{Network: network, Address: ip.AsSlice()}, nil
}

// cidrVIP reads {network: "", cidr: "10.0.0.0/24"}.
func (d *decoder) cidrVIP(n *yaml.Node, path string) (*workloadpb.NetworkAddress, error) {
	a := &workloadpb.NetworkAddress{}
	set := map[string]bool{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		set[key] = true
		switch key {
		case "network":
			var err error
			a.Network, err = d.str(v, p)
			return err
		case "cidr":
			pfx, err := d.prefix(v, p)
			if err != nil {
				return err
			}
			bits := uint32(pfx.Bits())
			a.Address, a.Length = pfx.Addr().AsSlice(), &bits
			return nil
		}
		return errUnknownField
	})
	if err != nil {
		return nil, err
	}
	return a, d.require(n, path, set, "cidr")
}

func (d *decoder) weightedWaypoint(n *yaml.Node, path string) (*workloadpb.WeightedWaypoint, error) {
	ww := &workloadpb.WeightedWaypoint{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		var err error
		switch key {
		case "destination":
			ww.Destination, err = d.gateway(v, p)
		case "weight":
			var w uint64
			w, err = d.uint(v, p, 1<<32-1, false)
			ww.Weight = uint32(w)
		default:
			return errUnknownField
		}
		return err
	})
	return ww, err
}

func (d *decoder) loadBalancer(n *yaml.Node, path string) (*workloadpb.LoadBalancing, error) {
	lb := &workloadpb.LoadBalancing{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		var err error
		switch key {
		case "routingPreferences":
			err = d.seq(v, p, func(item *yaml.Node, ip string) error {
				i, err := d.enum(item, ip, "routing preference", "Region", "Zone", "Subzone", "Node", "Cluster", "Network")
				lb.RoutingPreference = append(lb.RoutingPreference, workloadpb.LoadBalancing_Scope(i+1))
				return err
			})
		case "mode":
			var i int
			i, err = d.enum(v, p, "mode", "Standard", "Strict", "Failover", "Passthrough")
			lb.Mode = workloadpb.LoadBalancing_Mode(i)
		case "healthPolicy":
			var i int
			i, err = d.enum(v, p, "healthPolicy", "OnlyHealthy", "AllowAll")
			lb.HealthPolicy = workloadpb.LoadBalancing_HealthPolicy(i)
		default:
			return errUnknownField
		}
		return err
	})
	return lb, err
}

func (d *decoder) ip(n *yaml.Node, path string) (netip.Addr, error) {
	s, err := d.str(n, path)
	if err != nil {
		return netip.Addr{}, err
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, d.errf(n, path, "%q: not an IP address", s)
	}
	return ip, nil
}

// require reports the first of fields missing from set.
func (d *decoder) require(n *yaml.Node, path string, set map[string]bool, fields ...string) error {
	for _, f := range fields {
		if !set[f] {
			return d.errf(n, path, "missing field %q", f)
		}
	}
	return nil
}
