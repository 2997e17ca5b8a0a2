package xds_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// upstreamLocalhost is upstream ztunnel's examples/localhost.yaml, byte for
// byte: a file written for upstream must load here unchanged.
const upstreamLocalhost = `# This shows an example local config for ztunnel that adds a workload for localhost.
# This allows local testing by sending requests through the local ztunnel to other servers running on localhost.
workloads:
- uid: cluster1//v1/Pod/default/local
  name: local
  namespace: default
  serviceAccount: default
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  node: local
  network: ""
  services:
    "default/example.com":
      80: 8080
    "default/example2.com":
      80: 8080
# Define another local address, but this one uses TCP. This allows testing HBONE and TCP with one config.
- uid: cluster1//v1/Pod/default/local-tcp
  name: local-tcp
  namespace: default
  serviceAccount: default
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  node: local
  network: ""
  services:
    "default/example.com":
      80: 8080
    "default/example2.com":
      80: 8080
policies:
  - action: Allow
    rules:
    - - - notDestinationPorts:
          - 9999
    name: deny-9999
    namespace: default
    scope: Namespace
    dryRun: false
services:
- name: local
  namespace: default
  hostname: example.com
  vips:
    - /127.10.0.1
  ports:
    80: 8080
  subjectAltNames:
   - spiffe://cluster.local/ns/default/sa/local
  canonical: true
- name: remote
  namespace: default
  hostname: example2.com
  vips:
    - remote/127.10.0.2
  ports:
    80: 8080
  canonical: true
`

func newStore(t testing.TB) *state.Store {
	t.Helper()
	s, err := state.New(state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLoadUpstreamLocalhost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "localhost.yaml")
	if err := os.WriteFile(path, []byte(upstreamLocalhost), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	if err := xds.LoadFile(path, s); err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	snap := s.Snapshot()
	if w, sv, p := snap.Counts(); w != 2 || sv != 2 || p != 1 {
		t.Fatalf("counts = %d workloads, %d services, %d policies; want 2, 2, 1", w, sv, p)
	}
	local := snap.WorkloadByAddr("", netip.MustParseAddr("127.0.0.1"))
	if local == nil || local.UID != "cluster1//v1/Pod/default/local" || local.Protocol != state.ProtocolHBONE ||
		local.SPIFFEID() != "spiffe://cluster.local/ns/default/sa/default" || local.Node != "local" {
		t.Errorf("127.0.0.1 = %+v", local)
	}
	if tcp := snap.WorkloadByAddr("", netip.MustParseAddr("127.0.0.2")); tcp == nil || tcp.Protocol != state.ProtocolTCP {
		t.Errorf("127.0.0.2 = %+v", tcp)
	}
	remote := snap.ServiceByVIP("remote", netip.MustParseAddr("127.10.0.2"), "")
	if remote == nil || remote.Key() != "default/example2.com" || !remote.Canonical {
		t.Errorf("remote/127.10.0.2 = %+v", remote)
	}
	svc := snap.ServiceByVIP("", netip.MustParseAddr("127.10.0.1"), "")
	if svc == nil || svc.Ports[80] != 8080 || !slices.Equal(svc.SubjectAltNames, []string{"spiffe://cluster.local/ns/default/sa/local"}) {
		t.Fatalf("/127.10.0.1 = %+v", svc)
	}
	if eps := snap.Endpoints(svc); len(eps) != 2 || eps[0].Ports[80] != 8080 {
		t.Errorf("endpoints of example.com = %v", eps)
	}
	pol := snap.Policy("default/deny-9999")
	if pol == nil || pol.Scope != rbac.ScopeNamespace || pol.Action != rbac.Allow ||
		!slices.Equal(pol.Source.GetRules()[0].GetClauses()[0].GetMatches()[0].GetNotDestinationPorts(), []uint32{9999}) {
		t.Errorf("policy = %+v", pol)
	}
	var applied []string
	for p := range snap.PoliciesFor(local) {
		applied = append(applied, p.Key())
	}
	if !slices.Equal(applied, []string{"default/deny-9999"}) {
		t.Errorf("PoliciesFor(local) = %v", applied)
	}
}

func TestLoadExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found %d example files, want at least 2", len(files))
	}
	checks := map[string]func(t *testing.T, snap *state.Snapshot){
		"localhost.yaml": func(t *testing.T, snap *state.Snapshot) {
			if w, sv, p := snap.Counts(); w != 2 || sv != 2 || p != 1 {
				t.Errorf("counts = %d, %d, %d", w, sv, p)
			}
		},
		"two-pods.yaml": func(t *testing.T, snap *state.Snapshot) {
			server := snap.WorkloadByAddr("", netip.MustParseAddr("10.10.0.12"))
			if server == nil || server.ServiceAccount != "server" {
				t.Fatalf("server = %+v", server)
			}
			var deny *rbac.Policy
			for p := range snap.PoliciesFor(server) {
				if p.Action == rbac.Deny {
					deny = p
				}
			}
			if deny == nil || deny.Key() != "demo/deny-client-admin" {
				t.Fatalf("no deny policy applies to the server")
			}
			clauses := deny.Source.GetRules()[0].GetClauses()
			if len(clauses) != 2 || clauses[0].GetMatches()[0].GetPrincipals()[0].GetExact() != "cluster.local/ns/demo/sa/client" ||
				clauses[1].GetMatches()[0].GetDestinationPorts()[0] != 9090 {
				t.Errorf("deny rules = %v", clauses)
			}
			svc := snap.ServiceByHostname("demo/echo.demo.svc.cluster.local", "")
			if eps := snap.Endpoints(svc); len(eps) != 1 || eps[0].Workload != server {
				t.Errorf("echo endpoints = %v", eps)
			}
		},
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			s := newStore(t)
			if err := xds.LoadFile(f, s); err != nil {
				t.Fatal(err)
			}
			if check := checks[filepath.Base(f)]; check != nil {
				check(t, s.Snapshot())
			} else if w, sv, p := s.Snapshot().Counts(); w+sv+p == 0 {
				t.Error("example loads to nothing")
			}
		})
	}
}

func TestLoadReplacesPreviousState(t *testing.T) {
	s := newStore(t)
	if err := xds.Load("a.yaml", []byte(upstreamLocalhost), s); err != nil {
		t.Fatal(err)
	}
	second := "workloads:\n- uid: only\n  namespace: default\n  workloadIps: [\"127.0.0.9\"]\n"
	if err := xds.Load("b.yaml", []byte(second), s); err != nil {
		t.Fatal(err)
	}
	if w, sv, p := s.Snapshot().Counts(); w != 1 || sv != 0 || p != 0 {
		t.Errorf("counts after second load = %d, %d, %d; want 1, 0, 0", w, sv, p)
	}
	if err := xds.Load("empty.yaml", nil, s); err != nil {
		t.Fatal(err)
	}
	if w, sv, p := s.Snapshot().Counts(); w+sv+p != 0 {
		t.Errorf("an empty file left %d, %d, %d", w, sv, p)
	}
}

func TestLoadAllFields(t *testing.T) {
	const cfg = `
workloads:
- uid: u1
  name: n
  namespace: ns
  hostname: vm.example
  network: net1
  trustDomain: td
  serviceAccount: sa
  node: node-a
  canonicalName: app
  canonicalRevision: v2
  workloadName: app
  workloadType: cronjob
  workloadIps: ["10.0.0.1", "fd00::1"]
  protocol: HBONE
  networkMode: HostNetwork
  status: Unhealthy
  waypoint: {destination: "ns/waypoint.ns.svc", hboneMtlsPort: 15008}
  networkGateway: {destination: "net2/192.0.2.1"}
  nativeTunnel: true
  applicationTunnel: {protocol: PROXY, port: 15088}
  authorizationPolicies: [ns/p]
  locality: {region: r, zone: z, subzone: s}
  capacity: 3
  clusterId: c1
  services: {"ns/h": {"80": 8080}}
services:
- name: h
  namespace: ns
  hostname: h
  vips: ["/10.9.0.1"]
  cidrVips: [{network: net1, cidr: 10.8.0.0/16}]
  ports: {80: 0}
  subjectAltNames: [spiffe://td/ns/ns/sa/sa]
  waypoint: {destination: "/10.9.0.9", hboneMtlsPort: 15008}
  weightedWaypoints: [{destination: {destination: "ns/wp2"}, weight: 5}]
  loadBalancer: {routingPreferences: [Network, Region], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: Dual
  canonical: true
  visibility: Namespace
policies:
- name: p
  namespace: ns
  scope: WorkloadSelector
  action: Deny
  dryRun: true
  rules:
  - - - namespaces: [{Exact: a}, !Prefix b, {Suffix: c}, !Presence ]
        notNamespaces: [{Presence: []}]
        principals: [{Exact: td/ns/x/sa/y}]
        notPrincipals: [!Exact z]
        serviceAccounts: [{namespace: x, serviceAccount: y}]
        notServiceAccounts: [{namespace: x, serviceAccount: z}]
        sourceIps: [10.0.0.0/8, 192.0.2.1]
        notSourceIps: ["fd00::/8"]
        destinationIps: [10.1.0.0/16]
        notDestinationIps: [10.1.2.3/32]
        destinationPorts: [80]
        notDestinationPorts: [81]
`
	s := newStore(t)
	if err := xds.Load("all.yaml", []byte(cfg), s); err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	w := snap.WorkloadByUID("u1")
	if w == nil || w.NetworkMode != state.NetworkModeHostNetwork || w.Status != state.Unhealthy || w.WorkloadType != "cronjob" ||
		w.Waypoint.Destination() != "ns/waypoint.ns.svc" || w.NetworkGateway.Destination() != "net2/192.0.2.1" ||
		w.NetworkGateway.HBONEPort != 15008 || w.ApplicationTunnel.Port != 15088 || w.Capacity != 3 || w.ClusterID != "c1" ||
		w.Locality.Subzone != "s" || w.Services["ns/h"][80] != 8080 || len(w.IPs) != 2 || !w.NativeTunnel {
		t.Errorf("workload = %+v", w)
	}
	svc := snap.Service("ns/h")
	if svc == nil || len(svc.CIDRVIPs) != 1 || svc.CIDRVIPs[0].Prefix.String() != "10.8.0.0/16" || svc.Visibility != state.VisibilityNamespace ||
		svc.LoadBalancer.Mode != state.LBFailover || svc.LoadBalancer.RoutingPreferences[0] != state.LBScopeNetwork ||
		svc.IPFamilies != state.IPFamiliesDual || svc.WeightedWaypoints[0].Weight != 5 || svc.Waypoint.Destination() != "/10.9.0.9" {
		t.Errorf("service = %+v", svc)
	}
	m := snap.Policy("ns/p").Source.GetRules()[0].GetClauses()[0].GetMatches()[0]
	ns := m.GetNamespaces()
	if len(ns) != 4 || ns[0].GetExact() != "a" || ns[1].GetPrefix() != "b" || ns[2].GetSuffix() != "c" || ns[3].GetPresence() == nil ||
		m.GetNotNamespaces()[0].GetPresence() == nil || m.GetNotPrincipals()[0].GetExact() != "z" ||
		m.GetSourceIps()[1].GetLength() != 32 || m.GetNotSourceIps()[0].GetLength() != 8 || m.GetNotDestinationPorts()[0] != 81 {
		t.Errorf("match = %v", m)
	}
}

func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"yaml syntax", "workloads: [", `local config x.yaml: yaml: line 1: did not find expected node content`},
		{"two documents", "workloads: []\n---\nservices: []\n", `local config x.yaml:2: more than one YAML document`},
		{"top level is a list", "- a", `local config x.yaml:1: (top level): want a mapping, got a sequence`},
		{"unknown top-level field", "workload: []", `local config x.yaml:1: (top level): unknown field "workload"`},
		{"workloads not a list", "workloads: {}", `local config x.yaml:1: workloads: want a sequence, got a mapping`},
		{"bad IP",
			"workloads:\n- uid: u\n  namespace: ns\n  workloadIps:\n  - 10.0.0.1\n  - 1.2.3\n",
			`local config x.yaml:6: workloads[0].workloadIps[1]: "1.2.3": not an IP address`},
		{"IP with a zone", "workloads:\n- {uid: u, namespace: ns, workloadIps: [\"fe80::1%eth0\"]}",
			`local config x.yaml:2: workloads[0].workloadIps[0]: "fe80::1%eth0": not an IP address`},
		{"unknown workload field", "workloads:\n- uid: u\n  namespace: ns\n  workloadIP: [10.0.0.1]\n",
			`local config x.yaml:4: workloads[0]: unknown field "workloadIP"`},
		{"duplicate field", "workloads:\n- uid: u\n  uid: v\n  namespace: ns\n",
			`local config x.yaml:3: workloads[0]: duplicate field "uid"`},
		{"missing namespace", "workloads:\n- uid: u\n",
			`local config x.yaml:2: workloads[0]: missing field "namespace"`},
		{"unknown protocol", "workloads:\n- {uid: u, namespace: ns, protocol: hbone}",
			`local config x.yaml:2: workloads[0].protocol: unknown protocol "hbone" (want TCP or HBONE)`},
		{"unknown workload type", "workloads:\n- {uid: u, namespace: ns, workloadType: Deployment}",
			`local config x.yaml:2: workloads[0].workloadType: unknown workloadType "Deployment" (want deployment, cronjob, pod or job)`},
		{"string where a bool goes", "workloads:\n- {uid: u, namespace: ns, nativeTunnel: \"yes\"}",
			`local config x.yaml:2: workloads[0].nativeTunnel: want true or false, got string "yes"`},
		{"number where a string goes", "workloads:\n- {uid: 12, namespace: ns}",
			`local config x.yaml:2: workloads[0].uid: want a string, got 12`},
		{"target port out of range", "workloads:\n- uid: u\n  namespace: ns\n  services:\n    ns/h:\n      80: 70000\n",
			`local config x.yaml:6: workloads[0].services["ns/h"]["80"]: port 70000 out of range 0-65535`},
		{"service port 0", "workloads:\n- uid: u\n  namespace: ns\n  services:\n    ns/h:\n      0: 80\n",
			`local config x.yaml:6: workloads[0].services["ns/h"]: port 0 out of range 1-65535`},
		{"negative port", "services:\n- {namespace: ns, hostname: h, ports: {80: -1}}",
			`local config x.yaml:2: services[0].ports["80"]: "-1": want a number 0-4294967295`},
		{"service key without slash", "workloads:\n- uid: u\n  namespace: ns\n  services:\n    h: {80: 80}\n",
			`local config x.yaml:5: workloads[0].services: service "h": want namespace/hostname`},
		{"duplicate uid", "workloads:\n- {uid: u, namespace: ns}\n- {uid: u, namespace: ns}\n",
			`local config x.yaml:3: workloads[1]: duplicate resource name "u" (first at line 2)`},
		{"uid collides with a service", "workloads:\n- {uid: ns/h, namespace: ns}\nservices:\n- {namespace: ns, hostname: h}\n",
			`local config x.yaml:4: services[0]: duplicate resource name "ns/h" (first at line 2)`},
		{"vip without network", "services:\n- {namespace: ns, hostname: h, vips: [10.0.0.1]}",
			`local config x.yaml:2: services[0].vips[0]: "10.0.0.1": want network/IP`},
		{"gateway destination", "workloads:\n- {uid: u, namespace: ns, waypoint: {destination: wp}}",
			`local config x.yaml:2: workloads[0].waypoint.destination: "wp": want network/IP or namespace/hostname`},
		{"gateway without destination", "workloads:\n- {uid: u, namespace: ns, waypoint: {hboneMtlsPort: 15008}}",
			`local config x.yaml:2: workloads[0].waypoint: missing field "destination"`},
		{"service endpoints", "services:\n- {namespace: ns, hostname: h, endpoints: {}}",
			`local config x.yaml:2: services[0].endpoints: not supported: list the service under each workload's services instead`},
		{"service missing hostname", "services:\n- {namespace: ns}",
			`local config x.yaml:2: services[0]: missing field "hostname"`},
		{"unknown routing preference", "services:\n- {namespace: ns, hostname: h, loadBalancer: {routingPreferences: [Planet]}}",
			`local config x.yaml:2: services[0].loadBalancer.routingPreferences[0]: unknown routing preference "Planet" (want Region, Zone, Subzone, Node, Cluster or Network)`},
		{"unknown action", "policies:\n- {name: p, namespace: ns, scope: Global, action: Audit}",
			`local config x.yaml:2: policies[0].action: unknown action "Audit" (want Allow or Deny)`},
		{"unknown scope", "policies:\n- {name: p, namespace: ns, scope: Cluster, action: Allow}",
			`local config x.yaml:2: policies[0].scope: unknown scope "Cluster" (want Global, Namespace or WorkloadSelector)`},
		{"policy without scope", "policies:\n- {name: p, namespace: ns, action: Deny}",
			`local config x.yaml:2: policies[0]: missing field "scope"`},
		{"duplicate policy", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny}\n- {name: p, namespace: ns, scope: Global, action: Allow}",
			`local config x.yaml:3: policies[1]: duplicate policy "ns/p" (first at line 2)`},
		{"rules not nested thrice", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[{destinationPorts: [1]}]]}",
			`local config x.yaml:2: policies[0].rules[0][0]: want a sequence, got a mapping`},
		{"unknown match field", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{destinationPort: [1]}]]]}",
			`local config x.yaml:2: policies[0].rules[0][0][0]: unknown field "destinationPort"`},
		{"bad source CIDR", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{sourceIps: [10.0.0.0/33]}]]]}",
			`local config x.yaml:2: policies[0].rules[0][0][0].sourceIps[0]: "10.0.0.0/33": not a CIDR`},
		{"match port out of range", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{notDestinationPorts: [65536]}]]]}",
			`local config x.yaml:2: policies[0].rules[0][0][0].notDestinationPorts[0]: port 65536 out of range 1-65535`},
		{"plain string match", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{namespaces: [foo]}]]]}",
			`local config x.yaml:2: policies[0].rules[0][0][0].namespaces[0]: want one of Exact, Prefix, Suffix or Presence, got string "foo"`},
		{"unknown string match", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{namespaces: [{Regex: x}]}]]]}",
			`local config x.yaml:2: policies[0].rules[0][0][0].namespaces[0].Regex: unknown string match "Regex" (want Exact, Prefix, Suffix or Presence)`},
		{"presence with a value", "policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{namespaces: [{Presence: x}]}]]]}",
			`local config x.yaml:2: policies[0].rules[0][0][0].namespaces[0].Presence: Presence takes no value, got string "x"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := &recorder{}
			err := xds.Load("x.yaml", []byte(tc.yaml), h)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error:\n got %v\nwant %s", err, tc.want)
			}
			var le *xds.LoadError
			if !errors.As(err, &le) {
				t.Errorf("%T is not a *LoadError", err)
			}
			if h.calls != 0 {
				t.Error("the handler was called for a malformed file")
			}
		})
	}
}

// recorder is a Handler that rejects the names in reject and records calls.
type recorder struct {
	reject map[string]error
	calls  int
}

func (r *recorder) pick(names []string) map[string]error {
	r.calls++
	out := map[string]error{}
	for _, n := range names {
		if err := r.reject[n]; err != nil {
			out[n] = err
		}
	}
	return out
}

func (r *recorder) UpdateAddresses(map[string]*workloadpb.Address, []string) map[string]error {
	return nil
}

func (r *recorder) UpdateAuthorizations(map[string]*securitypb.Authorization, []string) map[string]error {
	return nil
}

func (r *recorder) ReplaceAddresses(all map[string]*workloadpb.Address) map[string]error {
	var names []string
	for n := range all {
		names = append(names, n)
	}
	return r.pick(names)
}

func (r *recorder) ReplaceAuthorizations(all map[string]*securitypb.Authorization) map[string]error {
	var names []string
	for n := range all {
		names = append(names, n)
	}
	return r.pick(names)
}

func TestLoadReportsHandlerRejections(t *testing.T) {
	const cfg = "workloads:\n- {uid: u1, namespace: ns}\n- {uid: u2, namespace: ns}\nservices:\n- {namespace: ns, hostname: h}\n" +
		"policies:\n- {name: p, namespace: ns, scope: Global, action: Deny}\n"
	nope := errors.New("nope")
	h := &recorder{reject: map[string]error{"u2": nope, "ns/p": errors.New("bad policy")}}
	err := xds.Load("x.yaml", []byte(cfg), h)
	want := "local config x.yaml:3: workloads[1]: nope\nlocal config x.yaml:7: policies[0]: bad policy"
	if err == nil || err.Error() != want {
		t.Fatalf("error:\n got %v\nwant %s", err, want)
	}
	if !errors.Is(err, nope) {
		t.Error("the handler's error is not wrapped")
	}
	if h.calls != 2 {
		t.Errorf("handler calls = %d, want 2", h.calls)
	}
}

func TestLoadFileMissing(t *testing.T) {
	err := xds.LoadFile(filepath.Join(t.TempDir(), "absent.yaml"), newStore(t))
	if err == nil || !strings.HasPrefix(err.Error(), "local config: read: ") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error = %v", err)
	}
}

func TestLoadAliasBomb(t *testing.T) {
	// Aliases make each level n times wider: n^3 matches from a file of
	// about 3n aliases. The node budget stops the walk.
	const n = 128
	list := func(alias string) string {
		return "[" + strings.TrimSuffix(strings.Repeat(alias+", ", n), ", ") + "]"
	}
	cfg := "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n  rules:\n" +
		"  - [[&s {namespaces: [{Exact: x}]}]]\n" + // one rule, one clause, one match
		"  - [&clause " + list("*s") + "]\n" + // a clause of n matches
		"  - &rule " + list("*clause") + "\n" + // a rule of n such clauses
		strings.Repeat("  - *rule\n", n) // n such rules
	start := time.Now()
	err := xds.Load("bomb.yaml", []byte(cfg), newStore(t))
	if err == nil || !strings.Contains(err.Error(), "config too large") {
		t.Fatalf("alias bomb: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stopping took %v", d)
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(upstreamLocalhost))
	for _, p := range []string{"localhost.yaml", "two-pods.yaml"} {
		if data, err := os.ReadFile(filepath.Join("..", "..", "examples", p)); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{namespaces: [!Exact a, {Presence: []}]}]]]}"))
	f.Add([]byte("workloads:\n- {uid: u, namespace: ns, services: {ns/h: {80: 8080}}, waypoint: {destination: \"/1.2.3.4\"}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newStore(t)
		if err := xds.Load("fuzz.yaml", data, s); err != nil {
			return
		}
		// Whatever loaded is dumpable.
		snap := s.Snapshot()
		_ = snap.DumpWorkloads()
		_ = snap.DumpServices()
		_ = snap.DumpPolicies()
	})
}
