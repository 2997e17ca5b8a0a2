package state_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// meshStore holds n workloads spread over n/100 services, plus policies.
func meshStore(b *testing.B, n int) *state.Store {
	s := newStore(b)
	addrs := map[string]*workloadpb.Address{}
	for i := 0; i < n/100; i++ {
		a := svcAddr("ns", fmt.Sprintf("svc%d", i), withVIPs(fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)), withPorts(80, 8080))
		addrs[nameOf(a)] = a
	}
	for i := 0; i < n; i++ {
		a := wlAddr(fmt.Sprintf("c//Pod/ns/w%d", i), withIPs(fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256)), hbone,
			backs(fmt.Sprintf("ns/svc%d", i%(n/100)), 80, 8080))
		addrs[nameOf(a)] = a
	}
	if errs := s.ReplaceAddresses(addrs); len(errs) != 0 {
		b.Fatal(errs)
	}
	applyPolicies(b, s, policy("ns", "a", securitypb.Scope_NAMESPACE, 0), policy("root", "g", securitypb.Scope_GLOBAL, 1))
	return s
}

func BenchmarkUpdateOneWorkload(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := meshStore(b, n)
			a := wlAddr("c//Pod/ns/w7", withIPs("10.0.0.7"), hbone, backs("ns/svc7", 80, 9090))
			b.ReportAllocs()
			for b.Loop() {
				s.UpdateAddresses(map[string]*workloadpb.Address{"c//Pod/ns/w7": a}, nil)
			}
		})
	}
}

func BenchmarkLookups(b *testing.B) {
	s := meshStore(b, 10000)
	snap := s.Snapshot()
	ip := netip.MustParseAddr("10.0.1.2")
	vip := netip.MustParseAddrPort("10.96.0.8:80")
	src := snap.WorkloadByAddr("", ip)
	b.Run("WorkloadByAddr", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if snap.WorkloadByAddr("", ip) == nil {
				b.Fatal("not found")
			}
		}
	})
	b.Run("PoliciesFor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			for range snap.PoliciesFor(src) {
				n++
			}
			if n != 2 {
				b.Fatal(n)
			}
		}
	})
	b.Run("FindUpstream", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := snap.FindUpstream(src, "", vip, state.ResolveStandard, nil); !ok {
				b.Fatal("no upstream")
			}
		}
	})
}
