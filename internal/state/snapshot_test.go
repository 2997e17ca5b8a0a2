package state_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

var (
	hbone       = func(w *workloadpb.Workload) { w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE }
	hostNetwork = func(w *workloadpb.Workload) { w.NetworkMode = workloadpb.NetworkMode_HOST_NETWORK }
	unhealthy   = func(w *workloadpb.Workload) { w.Status = workloadpb.WorkloadStatus_UNHEALTHY }
	canonical   = func(s *workloadpb.Service) { s.Canonical = true }
	nsVisible   = func(s *workloadpb.Service) { s.Visibility = workloadpb.Service_NAMESPACE }
)

func inNetwork(n string) func(*workloadpb.Workload) {
	return func(w *workloadpb.Workload) { w.Network = n }
}

func uidOf(w *state.Workload) string {
	if w == nil {
		return "<nil>"
	}
	return w.UID
}

func keyOf(s *state.Service) string {
	if s == nil {
		return "<nil>"
	}
	return s.Key()
}

func TestWorkloadByAddr(t *testing.T) {
	s := newStore(t)
	apply(t, s,
		wlAddr("c1//WorkloadEntry/ns/vm-hbone", withIPs("10.0.0.1"), hbone),
		wlAddr("c1//Pod/ns/pod-tcp", withIPs("10.0.0.1")),
		wlAddr("c1//WorkloadEntry/ns/vm-tcp", withIPs("10.0.0.1")),
		wlAddr("a-other-net", withIPs("10.0.0.1"), inNetwork("n2")),
		wlAddr("host", withIPs("10.0.0.2"), hostNetwork),
		wlAddr("b-vm", withIPs("10.0.0.3")),
		wlAddr("c-vm", withIPs("10.0.0.3")),
	)
	snap := s.Snapshot()
	cases := []struct {
		name, network, ip, want string
	}{
		{"a pod outranks hbone and tcp entries", "", "10.0.0.1", "c1//Pod/ns/pod-tcp"},
		{"network scopes the address", "n2", "10.0.0.1", "a-other-net"},
		{"host network workloads are not indexed", "", "10.0.0.2", "<nil>"},
		{"equal rank: the one added last", "", "10.0.0.3", "c-vm"},
		{"unknown address", "", "10.0.0.99", "<nil>"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := uidOf(snap.WorkloadByAddr(tc.network, netip.MustParseAddr(tc.ip))); got != tc.want {
				t.Errorf("WorkloadByAddr(%q, %s) = %s, want %s", tc.network, tc.ip, got, tc.want)
			}
		})
	}
	// Removing the pod leaves the next best.
	s.UpdateAddresses(nil, []string{"c1//Pod/ns/pod-tcp"})
	if got := uidOf(s.Snapshot().WorkloadByAddr("", netip.MustParseAddr("10.0.0.1"))); got != "c1//WorkloadEntry/ns/vm-hbone" {
		t.Errorf("after removal: %s", got)
	}
}

func TestServiceLookups(t *testing.T) {
	u32 := func(v uint32) *uint32 { return &v }
	s := newStore(t)
	apply(t, s,
		svcAddr("a", "shared.example", withVIPs("10.9.0.1")),
		svcAddr("b", "shared.example", withVIPs("10.9.0.1"), canonical),
		svcAddr("c", "shared.example", withVIPs("10.9.0.1")),
		svcAddr("d", "private.example", withVIPs("10.9.0.2"), nsVisible),
		svcAddr("e", "wide.example", func(s *workloadpb.Service) {
			s.Addresses = []*workloadpb.NetworkAddress{{Address: ipb("10.8.0.0"), Length: u32(16)}}
		}),
		svcAddr("f", "narrow.example", func(s *workloadpb.Service) {
			s.Addresses = []*workloadpb.NetworkAddress{{Address: ipb("10.8.1.0"), Length: u32(24)}}
		}),
	)
	snap := s.Snapshot()
	vip := func(ip string) netip.Addr { return netip.MustParseAddr(ip) }
	cases := []struct {
		name string
		got  *state.Service
		want string
	}{
		{"vip: client namespace wins", snap.ServiceByVIP("", vip("10.9.0.1"), "c"), "c/shared.example"},
		{"vip: else canonical", snap.ServiceByVIP("", vip("10.9.0.1"), "z"), "b/shared.example"},
		{"vip: other network", snap.ServiceByVIP("n2", vip("10.9.0.1"), ""), "<nil>"},
		{"vip: namespace-visible hidden from others", snap.ServiceByVIP("", vip("10.9.0.2"), "z"), "<nil>"},
		{"vip: namespace-visible seen in its namespace", snap.ServiceByVIP("", vip("10.9.0.2"), "d"), "d/private.example"},
		{"vip: no client namespace sees all", snap.ServiceByVIP("", vip("10.9.0.2"), ""), "d/private.example"},
		{"cidr: longest prefix", snap.ServiceByVIP("", vip("10.8.1.7"), ""), "f/narrow.example"},
		{"cidr: namespace beats prefix length", snap.ServiceByVIP("", vip("10.8.1.7"), "e"), "e/wide.example"},
		{"cidr: only the wide one contains it", snap.ServiceByVIP("", vip("10.8.2.7"), ""), "e/wide.example"},
		{"hostname: namespaced exact", snap.ServiceByHostname("a/shared.example", "c"), "a/shared.example"},
		{"hostname: bare, client namespace", snap.ServiceByHostname("shared.example", "c"), "c/shared.example"},
		{"hostname: bare, canonical", snap.ServiceByHostname("shared.example", ""), "b/shared.example"},
		{"hostname: unknown", snap.ServiceByHostname("x/shared.example", ""), "<nil>"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := keyOf(tc.got); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
	// Replacing a service moves its VIP index; removing one drops it.
	apply(t, s, svcAddr("c", "shared.example", withVIPs("10.9.0.3")))
	s.UpdateAddresses(nil, []string{"f/narrow.example"})
	snap = s.Snapshot()
	if got := keyOf(snap.ServiceByVIP("", vip("10.9.0.1"), "c")); got != "b/shared.example" {
		t.Errorf("old VIP after replace: %s", got)
	}
	if got := keyOf(snap.ServiceByVIP("", vip("10.9.0.3"), "")); got != "c/shared.example" {
		t.Errorf("new VIP after replace: %s", got)
	}
	if got := keyOf(snap.ServiceByVIP("", vip("10.8.1.7"), "")); got != "e/wide.example" {
		t.Errorf("cidr after removal: %s", got)
	}
}

func TestEndpoints(t *testing.T) {
	s := newStore(t)
	// Workloads first: endpoints exist before their service does.
	apply(t, s,
		wlAddr("w1", withIPs("10.0.0.1"), backs("ns/h", 80, 8080)),
		wlAddr("w2", withIPs("10.0.0.2"), backs("ns/h", 80, 9090), unhealthy),
		wlAddr("w3", withIPs("10.0.0.3"), backs("ns/other", 80, 80)),
	)
	apply(t, s, svcAddr("ns", "h", withPorts(80, 0, 443, 8443)))
	snap := s.Snapshot()
	svc := snap.Service("ns/h")
	uids := func(eps []*state.Endpoint) []string {
		var out []string
		for _, ep := range eps {
			out = append(out, ep.Workload.UID)
		}
		return out
	}
	if got := uids(snap.Endpoints(svc)); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("endpoints = %v, want only healthy w1", got)
	}
	if got := snap.ServicesOf(snap.WorkloadByUID("w1")); len(got) != 1 || got[0] != svc {
		t.Errorf("ServicesOf(w1) = %v", got)
	}
	apply(t, s, svcAddr("ns", "h", withPorts(80, 0), func(s *workloadpb.Service) {
		s.LoadBalancing = &workloadpb.LoadBalancing{HealthPolicy: workloadpb.LoadBalancing_ALLOW_ALL}
	}))
	snap = s.Snapshot()
	if got := uids(snap.Endpoints(snap.Service("ns/h"))); !slices.Equal(got, []string{"w1", "w2"}) {
		t.Errorf("AllowAll endpoints = %v", got)
	}
	// w1 moves to another service.
	apply(t, s, wlAddr("w1", withIPs("10.0.0.1"), backs("ns/other", 80, 80)))
	snap = s.Snapshot()
	if got := uids(snap.Endpoints(snap.Service("ns/h"))); !slices.Equal(got, []string{"w2"}) {
		t.Errorf("after move = %v", got)
	}
}

func TestTargetPort(t *testing.T) {
	svc := &state.Service{Ports: state.PortMap{80: 8080, 81: 0, 82: 0}}
	plain := &state.Workload{}
	tunnel := &state.Workload{ApplicationTunnel: &state.ApplicationTunnel{Port: 15088}}
	cases := []struct {
		name   string
		ep     state.Endpoint
		port   uint16
		want   uint16
		wantOK bool
	}{
		{"endpoint mapping first", state.Endpoint{Workload: plain, Ports: state.PortMap{80: 9090}}, 80, 9090, true},
		{"then the service target", state.Endpoint{Workload: plain}, 80, 8080, true},
		{"endpoint mapping of 0 is unset", state.Endpoint{Workload: plain, Ports: state.PortMap{80: 0}}, 80, 8080, true},
		{"service target 0 uses the endpoint", state.Endpoint{Workload: plain, Ports: state.PortMap{81: 7070}}, 81, 7070, true},
		{"no mapping anywhere", state.Endpoint{Workload: plain}, 82, 0, false},
		{"application tunnel keeps the service port", state.Endpoint{Workload: tunnel}, 82, 82, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.ep.TargetPort(svc, tc.port)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("TargetPort(%d) = %d, %v; want %d, %v", tc.port, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestPoliciesFor(t *testing.T) {
	s := newStore(t)
	applyPolicies(t, s,
		policy("istio-system", "global-allow", securitypb.Scope_GLOBAL, securitypb.Action_ALLOW),
		policy("ns", "ns-deny", securitypb.Scope_NAMESPACE, securitypb.Action_DENY),
		policy("ns", "ns-allow", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW),
		policy("other", "other-ns", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW),
		policy("ns", "selected", securitypb.Scope_WORKLOAD_SELECTOR, securitypb.Action_ALLOW),
		policy("ns", "not-selected", securitypb.Scope_WORKLOAD_SELECTOR, securitypb.Action_ALLOW),
	)
	snap := s.Snapshot()
	keys := func(w *state.Workload) []string {
		var out []string
		for p := range snap.PoliciesFor(w) {
			out = append(out, p.Key())
		}
		return out
	}
	cases := []struct {
		name string
		w    *state.Workload
		want []string
	}{
		{"namespace, then global", &state.Workload{Namespace: "ns"},
			[]string{"ns/ns-allow", "ns/ns-deny", "istio-system/global-allow"}},
		{"listed selector policies follow; unknown and duplicates skipped",
			&state.Workload{Namespace: "ns", AuthorizationPolicies: []string{"ns/selected", "ns/missing", "ns/ns-deny", "istio-system/global-allow", "ns/selected"}},
			[]string{"ns/ns-allow", "ns/ns-deny", "istio-system/global-allow", "ns/selected"}},
		{"global applies in any namespace", &state.Workload{Namespace: "elsewhere"},
			[]string{"istio-system/global-allow"}},
		{"a listed policy of another namespace applies", &state.Workload{Namespace: "elsewhere", AuthorizationPolicies: []string{"other/other-ns"}},
			[]string{"istio-system/global-allow", "other/other-ns"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := keys(tc.w); !slices.Equal(got, tc.want) {
				t.Errorf("PoliciesFor = %v, want %v", got, tc.want)
			}
		})
	}
	// Stopping early works.
	for range snap.PoliciesFor(&state.Workload{Namespace: "ns"}) {
		break
	}
	// Changing a policy's scope moves it between indexes.
	applyPolicies(t, s, policy("ns", "ns-deny", securitypb.Scope_WORKLOAD_SELECTOR, securitypb.Action_DENY))
	snap = s.Snapshot()
	if got := keys(&state.Workload{Namespace: "ns"}); !slices.Equal(got, []string{"ns/ns-allow", "istio-system/global-allow"}) {
		t.Errorf("after scope change: %v", got)
	}
	if p := snap.Policy("ns/ns-deny"); p == nil || p.Scope != rbac.ScopeWorkloadSelector {
		t.Errorf("Policy(ns/ns-deny) = %+v", p)
	}
}

func TestFindAddressAndHostname(t *testing.T) {
	s := newStore(t)
	apply(t, s,
		wlAddr("w1", withIPs("10.0.0.1"), func(w *workloadpb.Workload) { w.Hostname = "vm.example" }),
		svcAddr("ns", "h", withVIPs("10.9.0.1")),
	)
	snap := s.Snapshot()
	if a := snap.FindAddress("", netip.MustParseAddr("10.0.0.1"), ""); uidOf(a.Workload) != "w1" || a.Service != nil {
		t.Errorf("FindAddress(workload ip) = %+v", a)
	}
	if a := snap.FindAddress("", netip.MustParseAddr("10.9.0.1"), ""); keyOf(a.Service) != "ns/h" || a.Workload != nil {
		t.Errorf("FindAddress(vip) = %+v", a)
	}
	if a := snap.FindAddress("", netip.MustParseAddr("10.0.0.9"), ""); a.Found() {
		t.Errorf("FindAddress(unknown) = %+v", a)
	}
	if a := snap.FindHostname(state.NamespacedHostname{Namespace: "ns", Hostname: "h"}); keyOf(a.Service) != "ns/h" {
		t.Errorf("FindHostname(service) = %+v", a)
	}
	if a := snap.FindHostname(state.NamespacedHostname{Namespace: "ns", Hostname: "vm.example"}); uidOf(a.Workload) != "w1" {
		t.Errorf("FindHostname(workload) = %+v", a)
	}
	if a := snap.FindHostname(state.NamespacedHostname{Namespace: "other", Hostname: "vm.example"}); a.Found() {
		t.Errorf("FindHostname(wrong namespace) = %+v", a)
	}
}
