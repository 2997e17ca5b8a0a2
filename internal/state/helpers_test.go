package state_test

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// The store must satisfy the xDS Handler without importing xds.
var _ xds.Handler = (*state.Store)(nil)

func newStore(t testing.TB) *state.Store {
	t.Helper()
	s, err := state.New(state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ipb(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func pbWorkload(uid string, mut ...func(*workloadpb.Workload)) *workloadpb.Workload {
	w := &workloadpb.Workload{Uid: uid, Name: uid, Namespace: "ns"}
	for _, m := range mut {
		m(w)
	}
	return w
}

func wlAddr(uid string, mut ...func(*workloadpb.Workload)) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: pbWorkload(uid, mut...)}}
}

func svcAddr(ns, host string, mut ...func(*workloadpb.Service)) *workloadpb.Address {
	s := &workloadpb.Service{Name: host, Namespace: ns, Hostname: host}
	for _, m := range mut {
		m(s)
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Service{Service: s}}
}

func withIPs(ips ...string) func(*workloadpb.Workload) {
	return func(w *workloadpb.Workload) {
		for _, ip := range ips {
			w.Addresses = append(w.Addresses, ipb(ip))
		}
	}
}

// backs makes the workload an endpoint of the service key with port map
// pairs (service port, target port, ...).
func backs(key string, pairs ...uint32) func(*workloadpb.Workload) {
	return func(w *workloadpb.Workload) {
		if w.Services == nil {
			w.Services = map[string]*workloadpb.PortList{}
		}
		pl := &workloadpb.PortList{}
		for i := 0; i+1 < len(pairs); i += 2 {
			pl.Ports = append(pl.Ports, &workloadpb.Port{ServicePort: pairs[i], TargetPort: pairs[i+1]})
		}
		w.Services[key] = pl
	}
}

func withVIPs(ips ...string) func(*workloadpb.Service) {
	return func(s *workloadpb.Service) {
		for _, ip := range ips {
			s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Address: ipb(ip)})
		}
	}
}

func withPorts(pairs ...uint32) func(*workloadpb.Service) {
	return func(s *workloadpb.Service) {
		for i := 0; i+1 < len(pairs); i += 2 {
			s.Ports = append(s.Ports, &workloadpb.Port{ServicePort: pairs[i], TargetPort: pairs[i+1]})
		}
	}
}

func policy(ns, name string, scope securitypb.Scope, action securitypb.Action) *securitypb.Authorization {
	return &securitypb.Authorization{Name: name, Namespace: ns, Scope: scope, Action: action}
}

// apply upserts named address resources and fails the test on rejection.
func apply(t testing.TB, s *state.Store, addrs ...*workloadpb.Address) {
	t.Helper()
	m := map[string]*workloadpb.Address{}
	for _, a := range addrs {
		m[nameOf(a)] = a
	}
	if errs := s.UpdateAddresses(m, nil); len(errs) != 0 {
		t.Fatalf("UpdateAddresses rejected: %v", errs)
	}
}

func nameOf(a *workloadpb.Address) string {
	if w := a.GetWorkload(); w != nil {
		return w.GetUid()
	}
	return a.GetService().GetNamespace() + "/" + a.GetService().GetHostname()
}

func applyPolicies(t testing.TB, s *state.Store, pols ...*securitypb.Authorization) {
	t.Helper()
	m := map[string]*securitypb.Authorization{}
	for _, p := range pols {
		m[p.GetNamespace()+"/"+p.GetName()] = p
	}
	if errs := s.UpdateAuthorizations(m, nil); len(errs) != 0 {
		t.Fatalf("UpdateAuthorizations rejected: %v", errs)
	}
}

// oneError returns the only error in errs, failing otherwise.
func oneError(t *testing.T, errs map[string]error) error {
	t.Helper()
	if len(errs) != 1 {
		t.Fatalf("want exactly one rejection, got %d: %v", len(errs), errs)
	}
	for _, err := range errs {
		return err
	}
	return nil
}
