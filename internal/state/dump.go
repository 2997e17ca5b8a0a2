package state

import (
	"encoding/json"
	"net/netip"
	"slices"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// The types below are the JSON shapes of upstream ztunnel's /config_dump
// "workloads", "services" and "policies" sections (serde camelCase, fields
// in upstream's order, omitted where upstream skips defaults), which is what
// `istioctl ztunnel-config ... --file` parses.

// WorkloadDump is one entry of the "workloads" section.
type WorkloadDump struct {
	WorkloadIPs           []string       `json:"workloadIps"`
	Waypoint              *GatewayDump   `json:"waypoint,omitempty"`
	NetworkGateway        *GatewayDump   `json:"networkGateway,omitempty"`
	Protocol              string         `json:"protocol"`
	NetworkMode           string         `json:"networkMode"`
	UID                   string         `json:"uid,omitempty"`
	Name                  string         `json:"name"`
	Namespace             string         `json:"namespace"`
	TrustDomain           string         `json:"trustDomain,omitempty"`
	ServiceAccount        string         `json:"serviceAccount,omitempty"`
	Network               string         `json:"network,omitempty"`
	WorkloadName          string         `json:"workloadName,omitempty"`
	WorkloadType          string         `json:"workloadType,omitempty"`
	CanonicalName         string         `json:"canonicalName,omitempty"`
	CanonicalRevision     string         `json:"canonicalRevision,omitempty"`
	Hostname              string         `json:"hostname,omitempty"`
	Node                  string         `json:"node,omitempty"`
	NativeTunnel          bool           `json:"nativeTunnel,omitempty"`
	ApplicationTunnel     *AppTunnelDump `json:"applicationTunnel,omitempty"`
	AuthorizationPolicies []string       `json:"authorizationPolicies,omitempty"`
	Status                string         `json:"status"`
	ClusterID             string         `json:"clusterId"`
	Locality              *LocalityDump  `json:"locality,omitempty"`
	Services              []string       `json:"services,omitempty"`
	Capacity              uint32         `json:"capacity"`
}

// GatewayDump is a waypoint or network gateway.
type GatewayDump struct {
	// Destination is "network/ip" or "namespace/hostname".
	Destination   string `json:"destination"`
	HBONEMTLSPort uint16 `json:"hboneMtlsPort"`
}

// AppTunnelDump is a workload's application tunnel; Port is null when unset.
type AppTunnelDump struct {
	Protocol string  `json:"protocol"`
	Port     *uint16 `json:"port"`
}

// LocalityDump is a workload's locality.
type LocalityDump struct {
	Region  string `json:"region"`
	Zone    string `json:"zone"`
	Subzone string `json:"subzone"`
}

// ServiceDump is one entry of the "services" section.
type ServiceDump struct {
	Name              string                  `json:"name"`
	Namespace         string                  `json:"namespace"`
	Hostname          string                  `json:"hostname"`
	VIPs              []string                `json:"vips"`
	CIDRVIPs          []CIDRVIPDump           `json:"cidrVips,omitempty"`
	Ports             map[uint16]uint16       `json:"ports"`
	Endpoints         map[string]EndpointDump `json:"endpoints"`
	SubjectAltNames   []string                `json:"subjectAltNames"`
	Waypoint          *GatewayDump            `json:"waypoint,omitempty"`
	WeightedWaypoints []WeightedWaypointDump  `json:"weightedWaypoints,omitempty"`
	LoadBalancer      *LoadBalancerDump       `json:"loadBalancer,omitempty"`
	IPFamilies        string                  `json:"ipFamilies,omitempty"`
	Canonical         bool                    `json:"canonical"`
	Visibility        string                  `json:"visibility"`
}

// CIDRVIPDump is a CIDR VIP.
type CIDRVIPDump struct {
	Network string `json:"network"`
	CIDR    string `json:"cidr"`
}

// EndpointDump is one endpoint of a service, keyed by workload uid.
type EndpointDump struct {
	WorkloadUID string            `json:"workloadUid"`
	Port        map[uint16]uint16 `json:"port"`
	Status      string            `json:"status"`
}

// WeightedWaypointDump is one weighted waypoint.
type WeightedWaypointDump struct {
	Destination GatewayDump `json:"destination"`
	Weight      uint32      `json:"weight"`
}

// LoadBalancerDump is a service's load balancing.
type LoadBalancerDump struct {
	RoutingPreferences []string `json:"routingPreferences"`
	Mode               string   `json:"mode"`
	HealthPolicy       string   `json:"healthPolicy"`
}

// PolicyDump is one entry of the "policies" section.
type PolicyDump struct {
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Scope     string          `json:"scope"`
	Action    string          `json:"action"`
	Rules     [][][]MatchDump `json:"rules"`
	DryRun    bool            `json:"dryRun"`
}

// MatchDump is one match of a clause; empty lists are omitted.
type MatchDump struct {
	Namespaces          []StringMatchDump         `json:"namespaces,omitempty"`
	NotNamespaces       []StringMatchDump         `json:"notNamespaces,omitempty"`
	ServiceAccounts     []ServiceAccountMatchDump `json:"serviceAccounts,omitempty"`
	NotServiceAccounts  []ServiceAccountMatchDump `json:"notServiceAccounts,omitempty"`
	Principals          []StringMatchDump         `json:"principals,omitempty"`
	NotPrincipals       []StringMatchDump         `json:"notPrincipals,omitempty"`
	SourceIPs           []string                  `json:"sourceIps,omitempty"`
	NotSourceIPs        []string                  `json:"notSourceIps,omitempty"`
	DestinationIPs      []string                  `json:"destinationIps,omitempty"`
	NotDestinationIPs   []string                  `json:"notDestinationIps,omitempty"`
	DestinationPorts    []uint16                  `json:"destinationPorts,omitempty"`
	NotDestinationPorts []uint16                  `json:"notDestinationPorts,omitempty"`
}

// StringMatchDump is serde's externally tagged enum: {"Exact": "x"},
// {"Prefix": "x"}, {"Suffix": "x"} or {"Presence": []}.
type StringMatchDump struct {
	Kind  string // Exact, Prefix, Suffix or Presence
	Value string
}

// MarshalJSON writes the one-key object form.
func (m StringMatchDump) MarshalJSON() ([]byte, error) {
	if m.Kind == "Presence" {
		return []byte(`{"Presence":[]}`), nil
	}
	return json.Marshal(map[string]string{m.Kind: m.Value})
}

// ServiceAccountMatchDump matches a namespace and service account.
type ServiceAccountMatchDump struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

// DumpWorkloads is the "workloads" section: every workload, sorted by uid.
func (s *Snapshot) DumpWorkloads() []WorkloadDump {
	ws := s.Workloads()
	out := make([]WorkloadDump, 0, len(ws))
	for _, w := range ws {
		d := WorkloadDump{
			WorkloadIPs:           make([]string, 0, len(w.IPs)),
			Waypoint:              dumpGateway(w.Waypoint),
			NetworkGateway:        dumpGateway(w.NetworkGateway),
			Protocol:              w.Protocol.String(),
			NetworkMode:           w.NetworkMode.String(),
			UID:                   w.UID,
			Name:                  w.Name,
			Namespace:             w.Namespace,
			TrustDomain:           w.TrustDomain,
			ServiceAccount:        w.ServiceAccount,
			Network:               w.Network,
			WorkloadName:          w.WorkloadName,
			WorkloadType:          w.WorkloadType,
			CanonicalName:         w.CanonicalName,
			CanonicalRevision:     w.CanonicalRevision,
			Hostname:              w.Hostname,
			Node:                  w.Node,
			NativeTunnel:          w.NativeTunnel,
			AuthorizationPolicies: w.AuthorizationPolicies,
			Status:                w.Status.String(),
			ClusterID:             w.ClusterID,
			Services:              sortedKeys(w.Services),
			Capacity:              w.Capacity,
		}
		for _, ip := range w.IPs {
			d.WorkloadIPs = append(d.WorkloadIPs, ip.String())
		}
		if t := w.ApplicationTunnel; t != nil {
			d.ApplicationTunnel = &AppTunnelDump{Protocol: t.Protocol.String()}
			if t.Port != 0 {
				port := t.Port
				d.ApplicationTunnel.Port = &port
			}
		}
		if w.Locality != (Locality{}) {
			d.Locality = &LocalityDump{Region: w.Locality.Region, Zone: w.Locality.Zone, Subzone: w.Locality.Subzone}
		}
		out = append(out, d)
	}
	return out
}

// DumpServices is the "services" section: every service sorted by
// hostname, then namespace, with its endpoints.
func (s *Snapshot) DumpServices() []ServiceDump {
	svcs := s.Services()
	out := make([]ServiceDump, 0, len(svcs))
	for _, svc := range svcs {
		d := ServiceDump{
			Name:            svc.Name,
			Namespace:       svc.Namespace,
			Hostname:        svc.Hostname,
			VIPs:            make([]string, 0, len(svc.VIPs)),
			Ports:           map[uint16]uint16(svc.Ports),
			Endpoints:       map[string]EndpointDump{},
			SubjectAltNames: svc.SubjectAltNames,
			Waypoint:        dumpGateway(svc.Waypoint),
			IPFamilies:      svc.IPFamilies.String(),
			Canonical:       svc.Canonical,
			Visibility:      svc.Visibility.String(),
		}
		if d.Ports == nil {
			d.Ports = map[uint16]uint16{}
		}
		if d.SubjectAltNames == nil {
			d.SubjectAltNames = []string{}
		}
		for _, v := range svc.VIPs {
			d.VIPs = append(d.VIPs, v.String())
		}
		for _, c := range svc.CIDRVIPs {
			d.CIDRVIPs = append(d.CIDRVIPs, CIDRVIPDump{Network: c.Network, CIDR: c.Prefix.String()})
		}
		for _, ep := range s.Endpoints(svc) {
			ports := map[uint16]uint16(ep.Ports)
			if ports == nil {
				ports = map[uint16]uint16{}
			}
			d.Endpoints[ep.Workload.UID] = EndpointDump{WorkloadUID: ep.Workload.UID, Port: ports, Status: ep.Workload.Status.String()}
		}
		for _, ww := range svc.WeightedWaypoints {
			d.WeightedWaypoints = append(d.WeightedWaypoints, WeightedWaypointDump{Destination: *dumpGateway(&ww.Destination), Weight: ww.Weight})
		}
		if lb := svc.LoadBalancer; lb != nil {
			ld := &LoadBalancerDump{RoutingPreferences: []string{}, Mode: lb.Mode.String(), HealthPolicy: lb.HealthPolicy.String()}
			for _, p := range lb.RoutingPreferences {
				ld.RoutingPreferences = append(ld.RoutingPreferences, p.String())
			}
			d.LoadBalancer = ld
		}
		out = append(out, d)
	}
	return out
}

// DumpPolicies is the "policies" section: every policy sorted by key, its
// rules rendered from the Authorization it was compiled from.
func (s *Snapshot) DumpPolicies() []PolicyDump {
	pols := s.Policies()
	out := make([]PolicyDump, 0, len(pols))
	for _, p := range pols {
		out = append(out, dumpPolicy(p))
	}
	return out
}

func dumpPolicy(p *rbac.Policy) PolicyDump {
	d := PolicyDump{
		Name:      p.Name,
		Namespace: p.Namespace,
		Scope:     p.Scope.String(),
		Action:    p.Action.String(),
		Rules:     [][][]MatchDump{},
		DryRun:    p.DryRun,
	}
	for _, r := range p.Source.GetRules() {
		rule := [][]MatchDump{}
		for _, c := range r.GetClauses() {
			clause := []MatchDump{}
			for _, m := range c.GetMatches() {
				clause = append(clause, dumpMatch(m))
			}
			rule = append(rule, clause)
		}
		d.Rules = append(d.Rules, rule)
	}
	return d
}

func dumpMatch(m *securitypb.Match) MatchDump {
	return MatchDump{
		Namespaces:          dumpStrings(m.GetNamespaces()),
		NotNamespaces:       dumpStrings(m.GetNotNamespaces()),
		ServiceAccounts:     dumpServiceAccounts(m.GetServiceAccounts()),
		NotServiceAccounts:  dumpServiceAccounts(m.GetNotServiceAccounts()),
		Principals:          dumpStrings(m.GetPrincipals()),
		NotPrincipals:       dumpStrings(m.GetNotPrincipals()),
		SourceIPs:           dumpCIDRs(m.GetSourceIps()),
		NotSourceIPs:        dumpCIDRs(m.GetNotSourceIps()),
		DestinationIPs:      dumpCIDRs(m.GetDestinationIps()),
		NotDestinationIPs:   dumpCIDRs(m.GetNotDestinationIps()),
		DestinationPorts:    dumpPorts(m.GetDestinationPorts()),
		NotDestinationPorts: dumpPorts(m.GetNotDestinationPorts()),
	}
}

// dumpStrings drops matches with no type set, as upstream does.
func dumpStrings(in []*securitypb.StringMatch) []StringMatchDump {
	var out []StringMatchDump
	for _, m := range in {
		switch t := m.GetMatchType().(type) {
		case *securitypb.StringMatch_Exact:
			out = append(out, StringMatchDump{Kind: "Exact", Value: t.Exact})
		case *securitypb.StringMatch_Prefix:
			out = append(out, StringMatchDump{Kind: "Prefix", Value: t.Prefix})
		case *securitypb.StringMatch_Suffix:
			out = append(out, StringMatchDump{Kind: "Suffix", Value: t.Suffix})
		case *securitypb.StringMatch_Presence:
			out = append(out, StringMatchDump{Kind: "Presence"})
		}
	}
	return out
}

func dumpServiceAccounts(in []*securitypb.ServiceAccountMatch) []ServiceAccountMatchDump {
	var out []ServiceAccountMatchDump
	for _, m := range in {
		out = append(out, ServiceAccountMatchDump{Namespace: m.GetNamespace(), ServiceAccount: m.GetServiceAccount()})
	}
	return out
}

// dumpCIDRs renders "ip/len", dropping malformed entries as upstream does.
func dumpCIDRs(in []*securitypb.Address) []string {
	var out []string
	for _, a := range in {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok || int(a.GetLength()) > ip.BitLen() {
			continue
		}
		out = append(out, netip.PrefixFrom(ip, int(a.GetLength())).String())
	}
	return out
}

func dumpPorts(in []uint32) []uint16 {
	var out []uint16
	for _, p := range in {
		if p <= maxPort {
			out = append(out, uint16(p))
		}
	}
	return slices.Clip(out)
}

func dumpGateway(g *GatewayAddress) *GatewayDump {
	if g == nil {
		return nil
	}
	return &GatewayDump{Destination: g.Destination(), HBONEMTLSPort: g.HBONEPort}
}
