package interop

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	istioworkload "istio.io/istio/pkg/workloadapi"
	istiosecurity "istio.io/istio/pkg/workloadapi/security"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// xdsTimeout bounds each wait; a healthy run needs well under a second.
const xdsTimeout = 10 * time.Second

// Resource names as istiod gives them: a workload's uid, a service's
// "namespace/hostname", a policy's "namespace/name".
const (
	uidA     = "Kubernetes//Pod/default/pod-a"
	uidB     = "Kubernetes//Pod/other/pod-b"
	echoHost = "echo.default.svc.cluster.local"
	echoKey  = "default/" + echoHost
)

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

// istioResources builds the pushed resources with Istio's Go types.
func istioResources() (map[string]*istioworkload.Address, map[string]*istiosecurity.Authorization) {
	podA := &istioworkload.Workload{
		Uid:            uidA,
		Name:           "pod-a",
		Namespace:      "default",
		Addresses:      [][]byte{ip("10.0.0.1"), ip("fd00::1")},
		TunnelProtocol: istioworkload.TunnelProtocol_HBONE,
		TrustDomain:    "example.org",
		ServiceAccount: "sa-a",
		Waypoint: &istioworkload.GatewayAddress{
			Destination:   &istioworkload.GatewayAddress_Address{Address: &istioworkload.NetworkAddress{Address: ip("10.0.0.9")}},
			HboneMtlsPort: 15008,
		},
		Node:              "node-1",
		CanonicalName:     "echo",
		CanonicalRevision: "v1",
		WorkloadType:      istioworkload.WorkloadType_DEPLOYMENT,
		WorkloadName:      "echo",
		Services: map[string]*istioworkload.PortList{
			echoKey: {Ports: []*istioworkload.Port{{ServicePort: 80, TargetPort: 8080}}},
		},
		AuthorizationPolicies: []string{"default/selected"},
		ClusterId:             "cluster-1",
		Locality:              &istioworkload.Locality{Region: "r1", Zone: "z1", Subzone: "s1"},
		Capacity:              wrapperspb.UInt32(3),
	}
	podB := &istioworkload.Workload{
		Uid:       uidB,
		Name:      "pod-b",
		Namespace: "other",
		Addresses: [][]byte{ip("10.0.1.2")},
		Status:    istioworkload.WorkloadStatus_UNHEALTHY,
		NetworkGateway: &istioworkload.GatewayAddress{
			Destination: &istioworkload.GatewayAddress_Hostname{Hostname: &istioworkload.NamespacedHostname{
				Namespace: "istio-system", Hostname: "eastwest.istio-system.svc.cluster.local"}},
			HboneMtlsPort: 15008,
		},
	}
	echo := &istioworkload.Service{
		Name:            "echo",
		Namespace:       "default",
		Hostname:        echoHost,
		Addresses:       []*istioworkload.NetworkAddress{{Address: ip("10.96.0.10")}},
		Ports:           []*istioworkload.Port{{ServicePort: 80, TargetPort: 8080}},
		SubjectAltNames: []string{"spiffe://example.org/ns/default/sa/sa-a"},
		Waypoint: &istioworkload.GatewayAddress{
			Destination: &istioworkload.GatewayAddress_Hostname{Hostname: &istioworkload.NamespacedHostname{
				Namespace: "default", Hostname: "waypoint.default.svc.cluster.local"}},
			HboneMtlsPort: 15008,
		},
		LoadBalancing: &istioworkload.LoadBalancing{
			RoutingPreference: []istioworkload.LoadBalancing_Scope{istioworkload.LoadBalancing_NODE, istioworkload.LoadBalancing_ZONE},
			Mode:              istioworkload.LoadBalancing_FAILOVER,
			HealthPolicy:      istioworkload.LoadBalancing_ALLOW_ALL,
		},
		Visibility: istioworkload.Service_NAMESPACE,
	}
	addrs := map[string]*istioworkload.Address{
		uidA:    {Type: &istioworkload.Address_Workload{Workload: podA}},
		uidB:    {Type: &istioworkload.Address_Workload{Workload: podB}},
		echoKey: {Type: &istioworkload.Address_Service{Service: echo}},
	}

	exact := func(s string) *istiosecurity.StringMatch {
		return &istiosecurity.StringMatch{MatchType: &istiosecurity.StringMatch_Exact{Exact: s}}
	}
	policies := map[string]*istiosecurity.Authorization{
		// Only sa "client" of namespace default may reach port 8080.
		"default/allow-client": {
			Name: "allow-client", Namespace: "default",
			Scope: istiosecurity.Scope_NAMESPACE, Action: istiosecurity.Action_ALLOW,
			Groups: []*istiosecurity.Group{{Rules: []*istiosecurity.Rules{
				{Matches: []*istiosecurity.Match{{Principals: []*istiosecurity.StringMatch{exact("example.org/ns/default/sa/client")}}}},
				{Matches: []*istiosecurity.Match{{DestinationPorts: []uint32{8080}}}},
			}}},
		},
		// Nobody from 192.168.0.0/16, mesh-wide.
		"istio-system/deny-lan": {
			Name: "deny-lan", Namespace: "istio-system",
			Scope: istiosecurity.Scope_GLOBAL, Action: istiosecurity.Action_DENY,
			Groups: []*istiosecurity.Group{{Rules: []*istiosecurity.Rules{{Matches: []*istiosecurity.Match{
				{SourceIps: []*istiosecurity.Address{{Address: ip("192.168.0.0"), Length: 16}}},
			}}}}},
		},
		// Selected by pod-a by name; dry run.
		"default/selected": {
			Name: "selected", Namespace: "default",
			Scope: istiosecurity.Scope_WORKLOAD_SELECTOR, Action: istiosecurity.Action_DENY, DryRun: true,
			Groups: []*istiosecurity.Group{{Rules: []*istiosecurity.Rules{{Matches: []*istiosecurity.Match{
				{NotNamespaces: []*istiosecurity.StringMatch{{MatchType: &istiosecurity.StringMatch_Prefix{Prefix: "def"}}}},
			}}}}},
		},
	}
	return addrs, policies
}

// istiodBytes encodes m the way istiod does by default (vtprotobuf strict).
func istiodBytes(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := encodeVTStrict.marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestXDSWithIstioEncodedResources(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	addrs, policies := istioResources()
	for _, name := range slices.Sorted(maps.Keys(addrs)) {
		srv.SetRaw(xdstest.TypeURLAddress, name, istiodBytes(t, addrs[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		srv.SetRaw(xdstest.TypeURLAuthorization, name, istiodBytes(t, policies[name]))
	}

	store, err := state.New(state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := xds.New(xds.Options{Address: srv.URL(), Handler: store,
		Node: xds.NodeInfo{IP: "127.0.0.1", PodName: "ztunnel-x", PodNamespace: "istio-system", NodeName: "node-1"}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = client.Run(runCtx)
	}()
	t.Cleanup(func() { stop(); <-done })

	ctx, cancel := context.WithTimeout(context.Background(), xdsTimeout)
	defer cancel()
	select {
	case <-client.Ready():
	case <-ctx.Done():
		t.Fatalf("client not ready: %v", ctx.Err())
	}
	for _, typ := range []string{xdstest.TypeURLAddress, xdstest.TypeURLAuthorization} {
		if _, err := srv.WaitRequest(ctx, 0, func(r xdstest.Request) bool { return r.ACK() && r.Msg.GetTypeUrl() == typ }); err != nil {
			t.Fatalf("no ACK of %s: %v", typ, err)
		}
	}
	for _, r := range srv.Requests() {
		if r.NACK() {
			t.Errorf("client NACKed %s: %s", r.Msg.GetTypeUrl(), r.Msg.GetErrorDetail().GetMessage())
		}
	}

	sn := store.Snapshot()
	if w, s, p := sn.Counts(); w != 2 || s != 1 || p != 3 {
		t.Fatalf("counts: %d workloads, %d services, %d policies; want 2, 1, 3", w, s, p)
	}
	checkWorkloads(t, sn)
	checkService(t, sn)
	checkPolicies(t, sn)

	// A delta update, again encoded by Istio: pod-a moves, pod-b goes.
	from := srv.RequestCount()
	moved := proto.Clone(addrs[uidA]).(*istioworkload.Address)
	moved.GetWorkload().Addresses = [][]byte{ip("10.0.0.77")}
	srv.Push(xdstest.TypeURLAddress, map[string]proto.Message{uidA: xdstest.Raw(istiodBytes(t, moved))}, []string{uidB})
	ack, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool {
		return !r.Initial() && r.Msg.GetTypeUrl() == xdstest.TypeURLAddress
	})
	if err != nil {
		t.Fatalf("no answer to the update: %v", err)
	}
	if ack.NACK() {
		t.Fatalf("update NACKed: %s", ack.Msg.GetErrorDetail().GetMessage())
	}
	sn = store.Snapshot()
	if w := sn.WorkloadByUID(uidA); w == nil || !slices.Equal(w.IPs, []netip.Addr{netip.MustParseAddr("10.0.0.77")}) {
		t.Errorf("after update: pod-a = %+v, want IPs [10.0.0.77]", w)
	}
	if sn.WorkloadByUID(uidB) != nil {
		t.Error("after update: pod-b still present")
	}
}

func checkWorkloads(t *testing.T, sn *state.Snapshot) {
	t.Helper()
	a := sn.WorkloadByUID(uidA)
	if a == nil {
		t.Fatalf("workload %s missing", uidA)
	}
	if got := sn.WorkloadByAddr("", netip.MustParseAddr("fd00::1")); got != a {
		t.Errorf("WorkloadByAddr(fd00::1) = %v, want pod-a", got)
	}
	wantIPs := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	checks := []struct {
		name      string
		got, want any
	}{
		{"a.Name", a.Name, "pod-a"},
		{"a.Namespace", a.Namespace, "default"},
		{"a.IPs", a.IPs, wantIPs},
		{"a.Protocol", a.Protocol, state.ProtocolHBONE},
		{"a.SPIFFEID", a.SPIFFEID(), "spiffe://example.org/ns/default/sa/sa-a"},
		{"a.Waypoint", dest(a.Waypoint), "/10.0.0.9:15008"},
		{"a.Node", a.Node, "node-1"},
		{"a.CanonicalName", a.CanonicalName, "echo"},
		{"a.CanonicalRevision", a.CanonicalRevision, "v1"},
		{"a.WorkloadType", a.WorkloadType, "deployment"},
		{"a.WorkloadName", a.WorkloadName, "echo"},
		{"a.Services", a.Services, map[string]state.PortMap{echoKey: {80: 8080}}},
		{"a.AuthorizationPolicies", a.AuthorizationPolicies, []string{"default/selected"}},
		{"a.ClusterID", a.ClusterID, "cluster-1"},
		{"a.Locality", a.Locality, state.Locality{Region: "r1", Zone: "z1", Subzone: "s1"}},
		{"a.Capacity", a.Capacity, uint32(3)},
		{"a.Status", a.Status, state.Healthy},
	}
	b := sn.WorkloadByUID(uidB)
	if b == nil {
		t.Fatalf("workload %s missing", uidB)
	}
	checks = append(checks, []struct {
		name      string
		got, want any
	}{
		{"b.IPs", b.IPs, []netip.Addr{netip.MustParseAddr("10.0.1.2")}},
		{"b.Protocol", b.Protocol, state.ProtocolTCP},
		// Upstream's defaults for an empty trust domain / service account.
		{"b.SPIFFEID", b.SPIFFEID(), "spiffe://cluster.local/ns/other/sa/default"},
		{"b.Status", b.Status, state.Unhealthy},
		{"b.NetworkGateway", dest(b.NetworkGateway), "istio-system/eastwest.istio-system.svc.cluster.local:15008"},
		{"b.ClusterID", b.ClusterID, "Kubernetes"},
		{"b.Capacity", b.Capacity, uint32(1)},
	}...)
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func checkService(t *testing.T, sn *state.Snapshot) {
	t.Helper()
	svc := sn.ServiceByVIP("", netip.MustParseAddr("10.96.0.10"), "default")
	if svc == nil {
		t.Fatal("service echo not found by VIP 10.96.0.10 from namespace default")
	}
	if got := sn.ServiceByVIP("", netip.MustParseAddr("10.96.0.10"), "other"); got != nil {
		t.Error("NAMESPACE-visible service resolved from another namespace")
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"Key", svc.Key(), echoKey},
		{"VIPs", svc.VIPs, []state.NetworkAddress{{Addr: netip.MustParseAddr("10.96.0.10")}}},
		{"Ports", svc.Ports, state.PortMap{80: 8080}},
		{"SubjectAltNames", svc.SubjectAltNames, []string{"spiffe://example.org/ns/default/sa/sa-a"}},
		{"Waypoint", dest(svc.Waypoint), "default/waypoint.default.svc.cluster.local:15008"},
		{"LoadBalancer", *svc.LoadBalancer, state.LoadBalancer{
			RoutingPreferences: []state.LBScope{state.LBScopeNode, state.LBScopeZone},
			Mode:               state.LBFailover, HealthPolicy: state.AllowAll}},
		{"Visibility", svc.Visibility, state.VisibilityNamespace},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("service %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	eps := sn.Endpoints(svc)
	if len(eps) != 1 || eps[0].Workload.UID != uidA || !maps.Equal(eps[0].Ports, state.PortMap{80: 8080}) {
		t.Errorf("endpoints of echo = %v, want pod-a with 80→8080", eps)
	}
}

func checkPolicies(t *testing.T, sn *state.Snapshot) {
	t.Helper()
	scopes := map[string]struct {
		scope  rbac.Scope
		action rbac.Action
		dryRun bool
	}{
		"default/allow-client":  {rbac.ScopeNamespace, rbac.Allow, false},
		"istio-system/deny-lan": {rbac.ScopeGlobal, rbac.Deny, false},
		"default/selected":      {rbac.ScopeWorkloadSelector, rbac.Deny, true},
	}
	for key, want := range scopes {
		p := sn.Policy(key)
		if p == nil {
			t.Errorf("policy %s missing", key)
			continue
		}
		if p.Scope != want.scope || p.Action != want.action || p.DryRun != want.dryRun {
			t.Errorf("policy %s: scope %v action %v dry run %v, want %v %v %v", key, p.Scope, p.Action, p.DryRun, want.scope, want.action, want.dryRun)
		}
	}
	a := sn.WorkloadByUID(uidA)
	if got := policyKeys(sn.PoliciesFor(a)); !slices.Equal(got, []string{"default/allow-client", "default/selected", "istio-system/deny-lan"}) {
		t.Errorf("policies for pod-a = %v", got)
	}

	// The compiled rules decide as the Istio-encoded policies say.
	dst := netip.MustParseAddr("10.0.0.1")
	pols := slices.Collect(sn.PoliciesFor(a))
	tests := []struct {
		name    string
		conn    rbac.Conn
		allowed bool
		reason  rbac.Reason
	}{
		{"principal client on 8080", rbac.Conn{SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: dst, DstPort: 8080,
			SrcIdentity: "spiffe://example.org/ns/default/sa/client"}, true, rbac.ReasonAllowMatched},
		{"other principal on 8080", rbac.Conn{SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: dst, DstPort: 8080,
			SrcIdentity: "spiffe://example.org/ns/default/sa/intruder"}, false, rbac.ReasonNotAllowed},
		{"principal client on 9090", rbac.Conn{SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: dst, DstPort: 9090,
			SrcIdentity: "spiffe://example.org/ns/default/sa/client"}, false, rbac.ReasonNotAllowed},
		{"client from 192.168.3.4", rbac.Conn{SrcIP: netip.MustParseAddr("192.168.3.4"), DstIP: dst, DstPort: 8080,
			SrcIdentity: "spiffe://example.org/ns/default/sa/client"}, false, rbac.ReasonExplicitlyDenied},
	}
	for _, tc := range tests {
		d := rbac.Evaluate(pols, tc.conn)
		if d.Allowed != tc.allowed || d.Reason != tc.reason {
			t.Errorf("%s: allowed %v (%s), want %v (%s)", tc.name, d.Allowed, d.Reason, tc.allowed, tc.reason)
		}
	}
	// The dry-run DENY matches a client outside "def*" namespaces.
	d := rbac.Evaluate(pols, rbac.Conn{SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: dst, DstPort: 8080,
		SrcIdentity: "spiffe://example.org/ns/prod/sa/client"})
	if !slices.Contains(d.DryRun, rbac.DryRunResult{Policy: "default/selected", Action: rbac.Deny}) {
		t.Errorf("dry-run results %v, want default/selected DENY", d.DryRun)
	}
}

// dest renders a gateway as "network/ip" or "namespace/hostname" with its
// HBONE port, or "<nil>".
func dest(g *state.GatewayAddress) string {
	if g == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s:%d", g.Destination(), g.HBONEPort)
}

func policyKeys(seq func(func(*rbac.Policy) bool)) []string {
	var keys []string
	for p := range seq {
		keys = append(keys, p.Key())
	}
	slices.Sort(keys)
	return keys
}
