package state_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

func TestAddressRejections(t *testing.T) {
	u32 := func(v uint32) *uint32 { return &v }
	cases := []struct {
		name   string
		res    string // xDS resource name; "" = derived from the content
		addr   *workloadpb.Address
		want   string
		reason state.Reason
	}{
		{
			name: "workload address of 3 bytes",
			addr: wlAddr("u1", withIPs("10.0.0.1", "10.0.0.2"), func(w *workloadpb.Workload) { w.Addresses = append(w.Addresses, []byte{1, 2, 3}) }),
			want: `state: workload "u1": bad address 2: want 4 or 16 bytes, got 3`, reason: state.ReasonBadAddress,
		},
		{
			name: "workload without uid", res: "x",
			addr: wlAddr(""),
			want: `state: workload "x": missing field uid`, reason: state.ReasonMissingField,
		},
		{
			name: "workload named other than its uid", res: "x",
			addr: wlAddr("u1"),
			want: `state: workload "x": name mismatch: uid is "u1"`, reason: state.ReasonNameMismatch,
		},
		{
			name: "workload without namespace",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.Namespace = "" }),
			want: `state: workload "u1": missing field namespace`, reason: state.ReasonMissingField,
		},
		{
			name: "unknown tunnel protocol",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.TunnelProtocol = 7 }),
			want: `state: workload "u1": unknown enum tunnel_protocol 7`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "legacy istio mtls",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.TunnelProtocol = workloadpb.TunnelProtocol_LEGACY_ISTIO_MTLS }),
			want: `state: workload "u1": unsupported tunnel_protocol LEGACY_ISTIO_MTLS`, reason: state.ReasonUnsupported,
		},
		{
			name: "unknown network mode",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.NetworkMode = 5 }),
			want: `state: workload "u1": unknown enum network_mode 5`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "unknown status",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.Status = 9 }),
			want: `state: workload "u1": unknown enum status 9`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "unknown workload type",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.WorkloadType = 10 }),
			want: `state: workload "u1": unknown enum workload_type 10`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "waypoint without destination",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.Waypoint = &workloadpb.GatewayAddress{HboneMtlsPort: 15008} }),
			want: `state: workload "u1": missing gateway destination waypoint`, reason: state.ReasonMissingGateway,
		},
		{
			name: "waypoint address of 5 bytes",
			addr: wlAddr("u1", func(w *workloadpb.Workload) {
				w.Waypoint = &workloadpb.GatewayAddress{Destination: &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{Address: []byte{1, 2, 3, 4, 5}}}}
			}),
			want: `state: workload "u1": bad address waypoint: want 4 or 16 bytes, got 5`, reason: state.ReasonBadAddress,
		},
		{
			name: "network gateway port above 65535",
			addr: wlAddr("u1", func(w *workloadpb.Workload) {
				w.NetworkGateway = &workloadpb.GatewayAddress{HboneMtlsPort: 70000, Destination: &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{Address: ipb("10.0.0.9")}}}
			}),
			want: `state: workload "u1": bad port network_gateway.hbone_mtls_port 70000: want 0-65535`, reason: state.ReasonBadPort,
		},
		{
			name: "unknown application tunnel protocol",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.ApplicationTunnel = &workloadpb.ApplicationTunnel{Protocol: 3} }),
			want: `state: workload "u1": unknown enum application_tunnel.protocol 3`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "application tunnel port above 65535",
			addr: wlAddr("u1", func(w *workloadpb.Workload) { w.ApplicationTunnel = &workloadpb.ApplicationTunnel{Port: 65536} }),
			want: `state: workload "u1": bad port application_tunnel.port 65536: want 0-65535`, reason: state.ReasonBadPort,
		},
		{
			name: "services key without slash",
			addr: wlAddr("u1", backs("nohost", 80, 8080)),
			want: `state: workload "u1": bad service key "nohost": want namespace/hostname`, reason: state.ReasonBadServiceKey,
		},
		{
			name: "services service port 0",
			addr: wlAddr("u1", backs("ns/h", 80, 8080, 0, 9090)),
			want: `state: workload "u1": bad port services["ns/h"][1].service_port 0: want 1-65535`, reason: state.ReasonBadPort,
		},
		{
			name: "services target port above 65535",
			addr: wlAddr("u1", backs("ns/h", 80, 65536)),
			want: `state: workload "u1": bad port services["ns/h"][0].target_port 65536: want 0-65535`, reason: state.ReasonBadPort,
		},
		{
			name: "address with neither workload nor service", res: "x",
			addr: &workloadpb.Address{},
			want: `state: address "x": empty resource: neither workload nor service`, reason: state.ReasonEmptyResource,
		},
		{
			name: "service without namespace", res: "/h",
			addr: svcAddr("", "h"),
			want: `state: service "/h": missing field namespace`, reason: state.ReasonMissingField,
		},
		{
			name: "service without hostname", res: "ns/",
			addr: svcAddr("ns", ""),
			want: `state: service "ns/": missing field hostname`, reason: state.ReasonMissingField,
		},
		{
			name: "service named by hostname only", res: "h",
			addr: svcAddr("ns", "h"),
			want: `state: service "h": name mismatch: namespace/hostname is "ns/h"`, reason: state.ReasonNameMismatch,
		},
		{
			name: "service vip of 0 bytes",
			addr: svcAddr("ns", "h", withVIPs("10.0.0.1"), func(s *workloadpb.Service) {
				s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{})
			}),
			want: `state: service "ns/h": bad address vip 1: want 4 or 16 bytes, got 0`, reason: state.ReasonBadAddress,
		},
		{
			name: "service cidr vip longer than the address",
			addr: svcAddr("ns", "h", func(s *workloadpb.Service) {
				s.Addresses = []*workloadpb.NetworkAddress{{Address: ipb("10.0.0.0"), Length: u32(33)}}
			}),
			want: `state: service "ns/h": bad prefix vip 0: length 33 exceeds 32`, reason: state.ReasonBadPrefix,
		},
		{
			name: "service port 0",
			addr: svcAddr("ns", "h", withPorts(0, 80)),
			want: `state: service "ns/h": bad port ports[0].service_port 0: want 1-65535`, reason: state.ReasonBadPort,
		},
		{
			name: "service port above 65535",
			addr: svcAddr("ns", "h", withPorts(80, 80, 65536, 80)),
			want: `state: service "ns/h": bad port ports[1].service_port 65536: want 1-65535`, reason: state.ReasonBadPort,
		},
		{
			name: "unspecified routing preference",
			addr: svcAddr("ns", "h", func(s *workloadpb.Service) {
				s.LoadBalancing = &workloadpb.LoadBalancing{RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_ZONE, 0}}
			}),
			want: `state: service "ns/h": unknown enum load_balancing.routing_preference[1] 0`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "unknown load balancing mode",
			addr: svcAddr("ns", "h", func(s *workloadpb.Service) { s.LoadBalancing = &workloadpb.LoadBalancing{Mode: 9} }),
			want: `state: service "ns/h": unknown enum load_balancing.mode 9`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "unknown health policy",
			addr: svcAddr("ns", "h", func(s *workloadpb.Service) { s.LoadBalancing = &workloadpb.LoadBalancing{HealthPolicy: 4} }),
			want: `state: service "ns/h": unknown enum load_balancing.health_policy 4`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "unknown ip families",
			addr: svcAddr("ns", "h", func(s *workloadpb.Service) { s.IpFamilies = 8 }),
			want: `state: service "ns/h": unknown enum ip_families 8`, reason: state.ReasonUnknownEnum,
		},
		{
			name: "weighted waypoint without destination",
			addr: svcAddr("ns", "h", func(s *workloadpb.Service) {
				s.WeightedWaypoints = []*workloadpb.WeightedWaypoint{{Weight: 1}}
			}),
			want: `state: service "ns/h": missing gateway destination weighted_waypoints[0]`, reason: state.ReasonMissingGateway,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			res := tc.res
			if res == "" {
				res = nameOf(tc.addr)
			}
			err := oneError(t, s.UpdateAddresses(map[string]*workloadpb.Address{res: tc.addr}, nil))
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
			var re *state.RejectError
			if !errors.As(err, &re) || re.Reason != tc.reason || re.Name != res {
				t.Errorf("RejectError = %+v, want reason %q name %q", re, tc.reason, res)
			}
			if n, _, _ := s.Snapshot().Counts(); n != 0 || s.Snapshot().Version() != 0 {
				t.Errorf("a rejected resource changed the state: %d workloads, version %d", n, s.Snapshot().Version())
			}
		})
	}
}

func TestPolicyRejections(t *testing.T) {
	cases := []struct {
		name string
		res  string
		pol  *securitypb.Authorization
		want string
	}{
		{"nil", "ns/p", nil, `state: policy "ns/p": empty resource: no authorization`},
		{"no name", "ns/", policy("ns", "", 0, 0), `state: policy "ns/": missing field name`},
		{"no namespace", "/p", policy("", "p", 0, 0), `state: policy "/p": missing field namespace`},
		{"named by name only", "p", policy("ns", "p", 0, 0), `state: policy "p": name mismatch: namespace/name is "ns/p"`},
		{"unknown scope", "ns/p", policy("ns", "p", 3, 0), `state: policy "ns/p": unknown enum scope 3`},
		{"unknown action", "ns/p", policy("ns", "p", 0, 2), `state: policy "ns/p": unknown enum action 2`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			err := oneError(t, s.UpdateAuthorizations(map[string]*securitypb.Authorization{tc.res: tc.pol}, nil))
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestReasonLabel(t *testing.T) {
	if got := state.ReasonMissingGateway.Label(); got != "missing_gateway_destination" {
		t.Errorf("Label() = %q", got)
	}
}

func TestWorkloadConversion(t *testing.T) {
	s := newStore(t)
	apply(t, s,
		wlAddr("bare"),
		wlAddr("full", withIPs("10.0.0.1", "fd00::1"), backs("ns/a.example", 80, 8080), func(w *workloadpb.Workload) {
			w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
			w.TrustDomain, w.ServiceAccount, w.ClusterId = "td", "sa", "c1"
			w.WorkloadType = workloadpb.WorkloadType_CRONJOB
			w.Capacity = wrapperspb.UInt32(0)
			w.Status = workloadpb.WorkloadStatus_UNHEALTHY
			w.NetworkMode = workloadpb.NetworkMode_HOST_NETWORK
			w.Locality = &workloadpb.Locality{Region: "r", Zone: "z", Subzone: "s"}
			w.ApplicationTunnel = &workloadpb.ApplicationTunnel{Protocol: workloadpb.ApplicationTunnel_PROXY, Port: 15088}
			w.Waypoint = &workloadpb.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadpb.GatewayAddress_Hostname{
				Hostname: &workloadpb.NamespacedHostname{Namespace: "ns", Hostname: "wp.ns.svc"}}}
			w.AuthorizationPolicies = []string{"ns/p"}
		}),
	)
	snap := s.Snapshot()
	bare := snap.WorkloadByUID("bare")
	if bare.TrustDomain != "cluster.local" || bare.ServiceAccount != "default" || bare.ClusterID != "Kubernetes" ||
		bare.Capacity != 1 || bare.WorkloadType != "deployment" || bare.Protocol != state.ProtocolTCP {
		t.Errorf("defaults not applied: %+v", bare)
	}
	if got := bare.SPIFFEID(); got != "spiffe://cluster.local/ns/ns/sa/default" {
		t.Errorf("SPIFFEID = %s", got)
	}
	full := snap.WorkloadByUID("full")
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	if !slices.Equal(full.IPs, want) || full.TrustDomain != "td" || full.ServiceAccount != "sa" || full.ClusterID != "c1" ||
		full.WorkloadType != "cronjob" || full.Capacity != 0 || full.Status != state.Unhealthy ||
		full.NetworkMode != state.NetworkModeHostNetwork || full.Protocol != state.ProtocolHBONE ||
		full.Locality != (state.Locality{Region: "r", Zone: "z", Subzone: "s"}) ||
		*full.ApplicationTunnel != (state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088}) ||
		full.Waypoint.Destination() != "ns/wp.ns.svc" || full.Waypoint.HBONEPort != 15008 ||
		full.Services["ns/a.example"][80] != 8080 || !slices.Equal(full.AuthorizationPolicies, []string{"ns/p"}) {
		t.Errorf("fields not converted: %+v", full)
	}
}

func TestServiceConversion(t *testing.T) {
	u32 := func(v uint32) *uint32 { return &v }
	s := newStore(t)
	apply(t, s, svcAddr("ns", "h", withPorts(80, 8080, 443, 0), func(s *workloadpb.Service) {
		s.Addresses = []*workloadpb.NetworkAddress{
			{Network: "n1", Address: ipb("10.1.0.1")},
			{Address: ipb("10.2.0.1"), Length: u32(32)},
			{Address: ipb("10.3.0.0"), Length: u32(16)},
		}
		s.LoadBalancing = &workloadpb.LoadBalancing{
			RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_NETWORK, workloadpb.LoadBalancing_REGION},
			Mode:              workloadpb.LoadBalancing_FAILOVER, HealthPolicy: workloadpb.LoadBalancing_ALLOW_ALL,
		}
		s.IpFamilies = workloadpb.IPFamilies_DUAL
		s.Visibility = 7 // unknown: fails open to PUBLIC
	}))
	svc := s.Snapshot().Service("ns/h")
	if svc == nil {
		t.Fatal("service not stored")
	}
	if len(svc.VIPs) != 2 || svc.VIPs[0].String() != "n1/10.1.0.1" || svc.VIPs[1].String() != "/10.2.0.1" {
		t.Errorf("VIPs = %v", svc.VIPs)
	}
	if len(svc.CIDRVIPs) != 1 || svc.CIDRVIPs[0].Prefix.String() != "10.3.0.0/16" {
		t.Errorf("CIDRVIPs = %v", svc.CIDRVIPs)
	}
	lb := svc.LoadBalancer
	if lb == nil || !slices.Equal(lb.RoutingPreferences, []state.LBScope{state.LBScopeNetwork, state.LBScopeRegion}) ||
		lb.Mode != state.LBFailover || lb.HealthPolicy != state.AllowAll {
		t.Errorf("LoadBalancer = %+v", lb)
	}
	if svc.Ports[80] != 8080 || svc.Ports[443] != 0 || svc.IPFamilies != state.IPFamiliesDual || svc.Visibility != state.VisibilityPublic {
		t.Errorf("service = %+v", svc)
	}
}
