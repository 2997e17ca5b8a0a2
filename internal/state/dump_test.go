package state_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/dump.golden.json")

// dumpFixture is a store holding one of everything the dump renders.
func dumpFixture(t *testing.T) *state.Snapshot {
	u32 := func(v uint32) *uint32 { return &v }
	s := newStore(t)
	apply(t, s,
		wlAddr("Kubernetes//Pod/default/app-1", withIPs("10.244.1.5", "fd00::5"), hbone, backs("default/app.default.svc.cluster.local", 80, 8080),
			func(w *workloadpb.Workload) {
				w.Name, w.Namespace, w.ServiceAccount = "app-1", "default", "app"
				w.WorkloadName, w.WorkloadType = "app", workloadpb.WorkloadType_DEPLOYMENT
				w.CanonicalName, w.CanonicalRevision = "app", "v1"
				w.Node, w.NativeTunnel = "node-a", true
				w.Waypoint = &workloadpb.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadpb.GatewayAddress_Address{
					Address: &workloadpb.NetworkAddress{Address: ipb("10.96.0.10")}}}
				w.AuthorizationPolicies = []string{"default/selected"}
				w.Locality = &workloadpb.Locality{Region: "r1", Zone: "z1"}
			}),
		wlAddr("Kubernetes//Pod/default/app-2", withIPs("10.244.2.6"), unhealthy, backs("default/app.default.svc.cluster.local", 80, 8080),
			func(w *workloadpb.Workload) {
				w.Name, w.Namespace, w.Network = "app-2", "default", "net1"
				w.ApplicationTunnel = &workloadpb.ApplicationTunnel{Protocol: workloadpb.ApplicationTunnel_PROXY}
				w.NetworkGateway = &workloadpb.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadpb.GatewayAddress_Hostname{
					Hostname: &workloadpb.NamespacedHostname{Namespace: "istio-system", Hostname: "eastwest.istio-system.svc.cluster.local"}}}
			}),
		svcAddr("default", "app.default.svc.cluster.local", withVIPs("10.96.1.1"), withPorts(80, 8080), func(s *workloadpb.Service) {
			s.Name = "app"
			s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Network: "net1", Address: ipb("10.97.0.0"), Length: u32(16)})
			s.SubjectAltNames = []string{"spiffe://cluster.local/ns/default/sa/app"}
			s.Waypoint = &workloadpb.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadpb.GatewayAddress_Hostname{
				Hostname: &workloadpb.NamespacedHostname{Namespace: "default", Hostname: "waypoint.default.svc.cluster.local"}}}
			s.LoadBalancing = &workloadpb.LoadBalancing{Mode: workloadpb.LoadBalancing_FAILOVER,
				RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_REGION, workloadpb.LoadBalancing_ZONE}}
			s.IpFamilies = workloadpb.IPFamilies_DUAL
			s.Canonical = true
		}),
		svcAddr("default", "plain.default.svc.cluster.local", func(s *workloadpb.Service) { s.Name = "plain" }),
	)
	applyPolicies(t, s,
		&securitypb.Authorization{Name: "selected", Namespace: "default", Scope: securitypb.Scope_WORKLOAD_SELECTOR, Action: securitypb.Action_DENY,
			DryRun: true,
			Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{{
				Namespaces:          []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Exact{Exact: "other"}}},
				NotNamespaces:       []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Prefix{Prefix: "kube-"}}},
				Principals:          []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Suffix{Suffix: "/sa/bad"}}},
				NotPrincipals:       []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
				ServiceAccounts:     []*securitypb.ServiceAccountMatch{{Namespace: "other", ServiceAccount: "bad"}},
				SourceIps:           []*securitypb.Address{{Address: ipb("192.168.0.0"), Length: 16}},
				NotDestinationIps:   []*securitypb.Address{{Address: ipb("fd00::1"), Length: 128}},
				DestinationPorts:    []uint32{8080},
				NotDestinationPorts: []uint32{9999},
			}}}}}}},
		&securitypb.Authorization{Name: "allow-nothing", Namespace: "default", Scope: securitypb.Scope_NAMESPACE},
	)
	return s.Snapshot()
}

func TestDumpGolden(t *testing.T) {
	snap := dumpFixture(t)
	got, err := json.MarshalIndent(map[string]any{
		"workloads": snap.DumpWorkloads(),
		"services":  snap.DumpServices(),
		"policies":  snap.DumpPolicies(),
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "dump.golden.json")
	if *updateGolden {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("dump differs from %s (rerun with -update after checking the change):\n%s", path, got)
	}
}

func TestDumpEmpty(t *testing.T) {
	snap := newStore(t).Snapshot()
	got, err := json.Marshal([]any{snap.DumpWorkloads(), snap.DumpServices(), snap.DumpPolicies()})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "[[],[],[]]" {
		t.Errorf("empty dump = %s, want empty lists (not null)", got)
	}
}

// The structs below restate the field names and Go types that istioctl's
// ztunnel-config writer (istioctl/pkg/writer/ztunnel/configdump) unmarshals
// a dump into; a JSON type mismatch there makes `istioctl ztunnel-config
// --file` fail, so decoding our dump into them must succeed.
type istioctlGateway struct {
	Destination string `json:"destination"`
}

type istioctlWorkload struct {
	UID               string           `json:"uid"`
	WorkloadIPs       []string         `json:"workloadIps"`
	Waypoint          *istioctlGateway `json:"waypoint,omitempty"`
	NetworkGateway    *istioctlGateway `json:"networkGateway,omitempty"`
	Protocol          string           `json:"protocol"`
	Name              string           `json:"name"`
	Namespace         string           `json:"namespace"`
	ServiceAccount    string           `json:"serviceAccount"`
	WorkloadName      string           `json:"workloadName"`
	WorkloadType      string           `json:"workloadType"`
	CanonicalName     string           `json:"canonicalName"`
	CanonicalRevision string           `json:"canonicalRevision"`
	ClusterID         string           `json:"clusterId"`
	TrustDomain       string           `json:"trustDomain,omitempty"`
	Locality          struct {
		Region  string `json:"region,omitempty"`
		Zone    string `json:"zone,omitempty"`
		Subzone string `json:"subzone,omitempty"`
	} `json:"locality,omitempty"`
	Node              string `json:"node"`
	Network           string `json:"network,omitempty"`
	Status            string `json:"status"`
	Hostname          string `json:"hostname"`
	Capacity          uint32 `json:"capacity"`
	ApplicationTunnel struct {
		Protocol string  `json:"protocol"`
		Port     *uint16 `json:"port,omitempty"`
	} `json:"applicationTunnel,omitempty"`
	AuthorizationPolicies []string `json:"authorizationPolicies,omitempty"`
}

type istioctlService struct {
	Name      string   `json:"name"`
	Namespace string   `json:"namespace"`
	Hostname  string   `json:"hostname"`
	Addresses []string `json:"vips"`
	CIDRVIPs  []struct {
		CIDR    string `json:"cidr"`
		Network string `json:"network,omitempty"`
	} `json:"cidrVips,omitempty"`
	Ports        map[string]int `json:"ports"`
	LoadBalancer *struct {
		Mode               string   `json:"mode"`
		RoutingPreferences []string `json:"routingPreferences"`
		HealthPolicy       string   `json:"healthPolicy"`
	} `json:"loadBalancer,omitempty"`
	Waypoint  *istioctlGateway `json:"waypoint,omitempty"`
	Endpoints map[string]*struct {
		WorkloadUID string            `json:"workloadUid"`
		Service     string            `json:"service"`
		Address     string            `json:"address,omitempty"`
		Port        map[uint16]uint16 `json:"port"`
	} `json:"endpoints"`
	SubjectAltNames []string `json:"subjectAltNames,omitempty"`
	IPFamilies      string   `json:"ipFamilies"`
	Canonical       bool     `json:"canonical,omitempty"`
	Visibility      string   `json:"visibility,omitempty"`
}

type istioctlStringMatch struct {
	Exact    string `json:"Exact,omitempty"`
	Suffix   string `json:"Suffix,omitempty"`
	Prefix   string `json:"Prefix,omitempty"`
	Presence any    `json:"Presence,omitempty"`
}

type istioctlPolicy struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"`
	Action    string `json:"action"`
	Rules     [][][]*struct {
		Namespaces          []istioctlStringMatch `json:"namespaces,omitempty"`
		NotNamespaces       []istioctlStringMatch `json:"notNamespaces,omitempty"`
		Principals          []istioctlStringMatch `json:"principals,omitempty"`
		NotPrincipals       []istioctlStringMatch `json:"notPrincipals,omitempty"`
		SourceIps           []string              `json:"sourceIps,omitempty"`
		NotSourceIps        []string              `json:"notSourceIps,omitempty"`
		DestinationIps      []string              `json:"destinationIps,omitempty"`
		NotDestinationIps   []string              `json:"notDestinationIps,omitempty"`
		DestinationPorts    []uint16              `json:"destinationPorts,omitempty"`
		NotDestinationPorts []uint16              `json:"notDestinationPorts,omitempty"`
		ServiceAccounts     []struct {
			Namespace      string `json:"namespace"`
			ServiceAccount string `json:"serviceAccount"`
		} `json:"serviceAccounts,omitempty"`
	} `json:"rules"`
}

func TestDumpParsesAsIstioctlDoes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "dump.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Workloads []*istioctlWorkload `json:"workloads"`
		Services  []*istioctlService  `json:"services"`
		Policies  []*istioctlPolicy   `json:"policies"`
	}
	if err := json.Unmarshal(data, &dump); err != nil {
		t.Fatalf("istioctl's types cannot read the dump: %v", err)
	}
	if len(dump.Workloads) != 2 || len(dump.Services) != 2 || len(dump.Policies) != 2 {
		t.Fatalf("sections: %d workloads, %d services, %d policies", len(dump.Workloads), len(dump.Services), len(dump.Policies))
	}
	w := dump.Workloads[0]
	if w.UID != "Kubernetes//Pod/default/app-1" || w.Protocol != "HBONE" || w.Status != "Healthy" ||
		w.ServiceAccount != "app" || w.Waypoint.Destination != "/10.96.0.10" || w.Locality.Region != "r1" || w.Capacity != 1 {
		t.Errorf("workload as istioctl reads it: %+v", w)
	}
	svc := dump.Services[0]
	ep := svc.Endpoints["Kubernetes//Pod/default/app-1"]
	if svc.Ports["80"] != 8080 || ep == nil || ep.Port[80] != 8080 || svc.Addresses[0] != "/10.96.1.1" ||
		svc.LoadBalancer.Mode != "Failover" || svc.CIDRVIPs[0].CIDR != "10.97.0.0/16" {
		t.Errorf("service as istioctl reads it: %+v", svc)
	}
	m := dump.Policies[1].Rules[0][0][0]
	if dump.Policies[1].Action != "Deny" || m.Namespaces[0].Exact != "other" || m.NotPrincipals[0].Presence == nil ||
		m.DestinationPorts[0] != 8080 || m.SourceIps[0] != "192.168.0.0/16" {
		t.Errorf("policy as istioctl reads it: %+v", m)
	}
}
