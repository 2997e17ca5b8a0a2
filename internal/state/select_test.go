package state_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// firstPick makes the weighted draw land on the first candidate (in uid
// order); lastPick on the last.
var (
	firstPick state.Rand = func(uint64) uint64 { return 0 }
	lastPick  state.Rand = func(n uint64) uint64 { return n - 1 }
)

func locality(region, zone string) func(*workloadpb.Workload) {
	return func(w *workloadpb.Workload) { w.Locality = &workloadpb.Locality{Region: region, Zone: zone} }
}

func withCapacity(c uint32) func(*workloadpb.Workload) {
	return func(w *workloadpb.Workload) { w.Capacity = wrapperspb.UInt32(c) }
}

func lbPolicy(mode workloadpb.LoadBalancing_Mode, prefs ...workloadpb.LoadBalancing_Scope) func(*workloadpb.Service) {
	return func(s *workloadpb.Service) {
		s.LoadBalancing = &workloadpb.LoadBalancing{Mode: mode, RoutingPreference: prefs}
	}
}

func TestPickEndpoint(t *testing.T) {
	src := &state.Workload{UID: "src", Namespace: "ns", Locality: state.Locality{Region: "r1", Zone: "z1"}}
	gw := func(w *workloadpb.Workload) {
		w.NetworkGateway = &workloadpb.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadpb.GatewayAddress_Address{
			Address: &workloadpb.NetworkAddress{Network: "n2", Address: ipb("192.0.2.1")}}}
	}
	appTunnel := func(w *workloadpb.Workload) { w.ApplicationTunnel = &workloadpb.ApplicationTunnel{Port: 15088} }

	cases := []struct {
		name      string
		svc       *workloadpb.Address
		workloads []*workloadpb.Address
		port      uint16
		mode      state.ResolutionMode
		rnd       state.Rand
		want      string // chosen uid, or "<nil>"
	}{
		{
			name:      "port not on the service",
			svc:       svcAddr("ns", "h", withPorts(80, 8080)),
			workloads: []*workloadpb.Address{wlAddr("a", withIPs("10.0.0.1"), backs("ns/h", 80, 8080))},
			port:      81, want: "<nil>",
		},
		{
			name: "service target 0 skips endpoints without the port",
			svc:  svcAddr("ns", "h", withPorts(80, 0)),
			workloads: []*workloadpb.Address{
				wlAddr("a", withIPs("10.0.0.1"), backs("ns/h")),
				wlAddr("b", withIPs("10.0.0.2"), backs("ns/h", 80, 8080)),
			},
			port: 80, rnd: lastPick, want: "b",
		},
		{
			name: "waypoint mode accepts an app tunnel without the port",
			svc:  svcAddr("ns", "wp", withPorts(80, 80)),
			workloads: []*workloadpb.Address{
				wlAddr("a", withIPs("10.0.0.1"), backs("ns/wp")),
				wlAddr("b", withIPs("10.0.0.2"), backs("ns/wp"), appTunnel),
			},
			port: 15008, mode: state.ResolveWaypoint, rnd: lastPick, want: "b",
		},
		{
			name:      "waypoint mode with the port on the service takes anyone",
			svc:       svcAddr("ns", "wp", withPorts(15008, 15008)),
			workloads: []*workloadpb.Address{wlAddr("a", withIPs("10.0.0.1"), backs("ns/wp"))},
			port:      15008, mode: state.ResolveWaypoint, want: "a",
		},
		{
			name:      "addressless endpoint in our network is skipped",
			svc:       svcAddr("ns", "h", withPorts(80, 8080)),
			workloads: []*workloadpb.Address{wlAddr("a", backs("ns/h", 80, 8080), gw)},
			port:      80, want: "<nil>",
		},
		{
			name:      "addressless endpoint elsewhere with a gateway is used",
			svc:       svcAddr("ns", "h", withPorts(80, 8080)),
			workloads: []*workloadpb.Address{wlAddr("a", backs("ns/h", 80, 8080), gw, inNetwork("n2"))},
			port:      80, want: "a",
		},
		{
			name:      "addressless endpoint elsewhere without a gateway is skipped",
			svc:       svcAddr("ns", "h", withPorts(80, 8080)),
			workloads: []*workloadpb.Address{wlAddr("a", backs("ns/h", 80, 8080), inNetwork("n2"))},
			port:      80, want: "<nil>",
		},
		{
			name: "failover prefers the closest",
			svc:  svcAddr("ns", "h", withPorts(80, 8080), lbPolicy(workloadpb.LoadBalancing_FAILOVER, workloadpb.LoadBalancing_REGION, workloadpb.LoadBalancing_ZONE)),
			workloads: []*workloadpb.Address{
				wlAddr("a-far", withIPs("10.0.0.1"), backs("ns/h", 80, 8080), locality("r2", "z1")),
				wlAddr("b-region", withIPs("10.0.0.2"), backs("ns/h", 80, 8080), locality("r1", "z2")),
				wlAddr("c-zone", withIPs("10.0.0.3"), backs("ns/h", 80, 8080), locality("r1", "z1")),
				wlAddr("d-far", withIPs("10.0.0.4"), backs("ns/h", 80, 8080), locality("r3", "z1")),
			},
			port: 80, rnd: lastPick, want: "c-zone",
		},
		{
			name:      "failover falls back to the far ones",
			svc:       svcAddr("ns", "h", withPorts(80, 8080), lbPolicy(workloadpb.LoadBalancing_FAILOVER, workloadpb.LoadBalancing_REGION)),
			workloads: []*workloadpb.Address{wlAddr("a-far", withIPs("10.0.0.1"), backs("ns/h", 80, 8080), locality("r2", "z1"))},
			port:      80, want: "a-far",
		},
		{
			name:      "strict drops partial matches",
			svc:       svcAddr("ns", "h", withPorts(80, 8080), lbPolicy(workloadpb.LoadBalancing_STRICT, workloadpb.LoadBalancing_REGION, workloadpb.LoadBalancing_ZONE)),
			workloads: []*workloadpb.Address{wlAddr("b-region", withIPs("10.0.0.2"), backs("ns/h", 80, 8080), locality("r1", "z2"))},
			port:      80, want: "<nil>",
		},
		{
			name: "network first outranks every other scope",
			svc:  svcAddr("ns", "h", withPorts(80, 8080), lbPolicy(workloadpb.LoadBalancing_FAILOVER, workloadpb.LoadBalancing_NETWORK, workloadpb.LoadBalancing_REGION, workloadpb.LoadBalancing_ZONE)),
			workloads: []*workloadpb.Address{
				wlAddr("a-same-net", withIPs("10.0.0.1"), backs("ns/h", 80, 8080), locality("r9", "z9")),
				wlAddr("b-other-net", withIPs("10.0.0.2"), backs("ns/h", 80, 8080), locality("r1", "z1"), inNetwork("n2")),
			},
			port: 80, rnd: lastPick, want: "a-same-net",
		},
		{
			name: "standard mode ignores locality",
			svc:  svcAddr("ns", "h", withPorts(80, 8080), lbPolicy(workloadpb.LoadBalancing_UNSPECIFIED_MODE, workloadpb.LoadBalancing_REGION)),
			workloads: []*workloadpb.Address{
				wlAddr("a-near", withIPs("10.0.0.1"), backs("ns/h", 80, 8080), locality("r1", "z1")),
				wlAddr("b-far", withIPs("10.0.0.2"), backs("ns/h", 80, 8080), locality("r2", "z1")),
			},
			port: 80, rnd: lastPick, want: "b-far",
		},
		{
			name: "zero capacity is never chosen",
			svc:  svcAddr("ns", "h", withPorts(80, 8080)),
			workloads: []*workloadpb.Address{
				wlAddr("a", withIPs("10.0.0.1"), backs("ns/h", 80, 8080)),
				wlAddr("b", withIPs("10.0.0.2"), backs("ns/h", 80, 8080), withCapacity(0)),
			},
			port: 80, rnd: lastPick, want: "a",
		},
		{
			name: "first pick keeps the first",
			svc:  svcAddr("ns", "h", withPorts(80, 8080)),
			workloads: []*workloadpb.Address{
				wlAddr("a", withIPs("10.0.0.1"), backs("ns/h", 80, 8080)),
				wlAddr("b", withIPs("10.0.0.2"), backs("ns/h", 80, 8080)),
			},
			port: 80, rnd: firstPick, want: "a",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			apply(t, s, append(tc.workloads, tc.svc)...)
			snap := s.Snapshot()
			ep := snap.PickEndpoint(src, snap.Service(nameOf(tc.svc)), tc.port, tc.mode, tc.rnd)
			got := "<nil>"
			if ep != nil {
				got = ep.Workload.UID
			}
			if got != tc.want {
				t.Errorf("PickEndpoint = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPickEndpointWeightsByCapacity(t *testing.T) {
	s := newStore(t)
	apply(t, s,
		svcAddr("ns", "h", withPorts(80, 8080)),
		wlAddr("light", withIPs("10.0.0.1"), backs("ns/h", 80, 8080), withCapacity(1)),
		wlAddr("heavy", withIPs("10.0.0.2"), backs("ns/h", 80, 8080), withCapacity(3)),
	)
	snap := s.Snapshot()
	r := rand.New(rand.NewPCG(1, 2))
	const n = 8000
	heavy := 0
	for i := 0; i < n; i++ {
		if snap.PickEndpoint(nil, snap.Service("ns/h"), 80, state.ResolveStandard, r.Uint64N).Workload.UID == "heavy" {
			heavy++
		}
	}
	if frac := float64(heavy) / n; frac < 0.72 || frac > 0.78 {
		t.Errorf("heavy chosen %.3f of the time, want about 0.75", frac)
	}
}

func TestFindUpstreamAndGateways(t *testing.T) {
	s := newStore(t)
	apply(t, s,
		svcAddr("ns", "h", withVIPs("10.9.0.1"), withPorts(80, 8080)),
		svcAddr("ns", "pt", withVIPs("10.9.0.2"), withPorts(80, 80), lbPolicy(workloadpb.LoadBalancing_PASSTHROUGH)),
		svcAddr("ns", "waypoint", withVIPs("10.9.0.3"), withPorts(15021, 15021)),
		wlAddr("app", withIPs("10.0.0.1"), backs("ns/h", 80, 9090)),
		wlAddr("wp", withIPs("10.0.0.2"), backs("ns/waypoint", 15021, 15021),
			func(w *workloadpb.Workload) {
				w.ApplicationTunnel = &workloadpb.ApplicationTunnel{Port: 15008}
				w.Hostname = "wp.example"
			}),
	)
	snap := s.Snapshot()
	ap := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	check := func(name string, up state.Upstream, ok bool, wantUID string, wantPort uint16, wantSvc string) {
		t.Helper()
		if !ok || uidOf(up.Workload) != wantUID || up.Port != wantPort || keyOf(up.Service) != wantSvc {
			t.Errorf("%s = %s:%d via %s (ok=%v), want %s:%d via %s", name, uidOf(up.Workload), up.Port, keyOf(up.Service), ok, wantUID, wantPort, wantSvc)
		}
	}
	up, ok := snap.FindUpstream(nil, "", ap("10.9.0.1:80"), state.ResolveStandard, nil)
	check("service vip", up, ok, "app", 9090, "ns/h")
	up, ok = snap.FindUpstream(nil, "", ap("10.0.0.1:7000"), state.ResolveStandard, nil)
	check("workload ip", up, ok, "app", 7000, "<nil>")
	if up, ok := snap.FindUpstream(nil, "", ap("10.9.0.2:80"), state.ResolveStandard, nil); !ok || !up.Passthrough || up.Workload != nil {
		t.Errorf("passthrough = %+v, %v", up, ok)
	}
	if _, ok := snap.FindUpstream(nil, "", ap("10.9.9.9:80"), state.ResolveStandard, nil); ok {
		t.Error("unknown destination resolved")
	}

	byAddr := &state.GatewayAddress{Address: &state.NetworkAddress{Addr: netip.MustParseAddr("10.9.0.3")}, HBONEPort: 15008}
	up, ok = snap.ResolveGateway(nil, byAddr, state.ResolveWaypoint, nil)
	check("waypoint by vip", up, ok, "wp", 15008, "ns/waypoint")
	byHost := &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "waypoint"}, HBONEPort: 15008}
	up, ok = snap.ResolveGateway(nil, byHost, state.ResolveWaypoint, nil)
	check("waypoint by service hostname", up, ok, "wp", 15008, "ns/waypoint")
	byWorkloadHost := &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp.example"}, HBONEPort: 15008}
	up, ok = snap.ResolveGateway(nil, byWorkloadHost, state.ResolveWaypoint, nil)
	check("waypoint by workload hostname", up, ok, "wp", 15008, "<nil>")
	if _, ok := snap.ResolveGateway(nil, byHost, state.ResolveStandard, nil); ok {
		t.Error("standard mode reached a waypoint on a port its service lacks")
	}
	if _, ok := snap.ResolveGateway(nil, nil, state.ResolveWaypoint, nil); ok {
		t.Error("nil gateway resolved")
	}
}

func TestPickWaypoint(t *testing.T) {
	primary := &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "primary"}}
	svc := &state.Service{Waypoint: primary, WeightedWaypoints: []state.WeightedWaypoint{
		{Destination: state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "a"}}, Weight: 1},
		{Destination: state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "b"}}, Weight: 3},
	}}
	if got := svc.PickWaypoint(func(uint64) uint64 { return 0 }).Destination(); got != "ns/a" {
		t.Errorf("pick 0 = %s", got)
	}
	if got := svc.PickWaypoint(func(uint64) uint64 { return 1 }).Destination(); got != "ns/b" {
		t.Errorf("pick 1 = %s", got)
	}
	svc.WeightedWaypoints[0].Weight, svc.WeightedWaypoints[1].Weight = 0, 0
	if got := svc.PickWaypoint(nil); got != primary {
		t.Errorf("all weights 0: %v", got)
	}
}

func TestPickIP(t *testing.T) {
	w := &state.Workload{IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}}
	cases := []struct {
		name, requested string
		fam             state.IPFamilies
		want            string
	}{
		{"requested is ours", "fd00::1", state.IPFamiliesIPv4Only, "fd00::1"},
		{"same family as requested", "fd00::9", state.IPFamiliesAutomatic, "fd00::1"},
		{"family restriction wins", "fd00::9", state.IPFamiliesIPv4Only, "10.0.0.1"},
		{"v4 request", "10.9.9.9", state.IPFamiliesDual, "10.0.0.1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := w.PickIP(netip.MustParseAddr(tc.requested), tc.fam)
			if !ok || got.String() != tc.want {
				t.Errorf("PickIP = %s, %v; want %s", got, ok, tc.want)
			}
		})
	}
	if _, ok := (&state.Workload{IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}).PickIP(netip.MustParseAddr("fd00::9"), state.IPFamiliesIPv6Only); ok {
		t.Error("PickIP found an IP the family forbids")
	}
}
