package state_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRejectedResourceKeepsPreviousValue(t *testing.T) {
	s := newStore(t)
	apply(t, s, wlAddr("u1", withIPs("10.0.0.1")), svcAddr("ns", "h", withPorts(80, 8080)))

	errs := s.UpdateAddresses(map[string]*workloadpb.Address{
		"u1":   wlAddr("u1", func(w *workloadpb.Workload) { w.Addresses = [][]byte{{1}} }),
		"u2":   wlAddr("u2", withIPs("10.0.0.2")),
		"ns/h": svcAddr("ns", "h", withPorts(99999, 1)),
	}, nil)
	if len(errs) != 2 || errs["u1"] == nil || errs["ns/h"] == nil {
		t.Fatalf("rejections = %v, want u1 and ns/h", errs)
	}
	snap := s.Snapshot()
	if w := snap.WorkloadByUID("u1"); w == nil || w.IPs[0] != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("u1 = %+v, want the previous value", w)
	}
	if snap.WorkloadByUID("u2") == nil {
		t.Error("valid u2 was not applied")
	}
	if svc := snap.Service("ns/h"); svc == nil || svc.Ports[80] != 8080 {
		t.Errorf("ns/h = %+v, want the previous value", svc)
	}
}

func TestReplaceRemovesAbsentResources(t *testing.T) {
	s := newStore(t)
	apply(t, s, wlAddr("u1", withIPs("10.0.0.1")), wlAddr("u2", withIPs("10.0.0.2")), wlAddr("u3"),
		svcAddr("ns", "a", withVIPs("10.9.0.1")), svcAddr("ns", "b"))
	applyPolicies(t, s, policy("ns", "p1", 0, 0), policy("ns", "p2", 1, 1))

	errs := s.ReplaceAddresses(map[string]*workloadpb.Address{
		"u1":   wlAddr("u1", withIPs("10.0.0.1")),
		"u3":   wlAddr("u3", func(w *workloadpb.Workload) { w.Namespace = "" }), // rejected: keeps old u3
		"ns/b": svcAddr("ns", "b"),
	})
	if len(errs) != 1 || errs["u3"] == nil {
		t.Fatalf("rejections = %v, want only u3", errs)
	}
	snap := s.Snapshot()
	if snap.WorkloadByUID("u1") == nil || snap.WorkloadByUID("u3") == nil || snap.Service("ns/b") == nil {
		t.Error("named resources missing after Replace")
	}
	if snap.WorkloadByUID("u2") != nil || snap.WorkloadByAddr("", netip.MustParseAddr("10.0.0.2")) != nil {
		t.Error("u2 was not removed (or its address index survived)")
	}
	if snap.Service("ns/a") != nil || snap.ServiceByVIP("", netip.MustParseAddr("10.9.0.1"), "") != nil {
		t.Error("ns/a was not removed (or its VIP index survived)")
	}

	s.ReplaceAuthorizations(map[string]*securitypb.Authorization{"ns/p2": policy("ns", "p2", 1, 1)})
	if snap := s.Snapshot(); snap.Policy("ns/p1") != nil || snap.Policy("ns/p2") == nil {
		t.Errorf("policies after Replace: p1=%v p2=%v", snap.Policy("ns/p1"), snap.Policy("ns/p2"))
	}
}

func TestUpdateRemoves(t *testing.T) {
	s := newStore(t)
	apply(t, s, wlAddr("u1", withIPs("10.0.0.1"), backs("ns/h", 80, 8080)), svcAddr("ns", "h", withPorts(80, 0)))
	applyPolicies(t, s, policy("ns", "p", 1, 0))
	s.UpdateAddresses(nil, []string{"u1", "ns/h", "unknown"})
	s.UpdateAuthorizations(nil, []string{"ns/p"})
	snap := s.Snapshot()
	if w, sv, p := snap.Counts(); w+sv+p != 0 {
		t.Errorf("counts after removal = %d, %d, %d", w, sv, p)
	}
	if snap.WorkloadByAddr("", netip.MustParseAddr("10.0.0.1")) != nil {
		t.Error("address index survived removal")
	}
	if eps := snap.Endpoints(&state.Service{Namespace: "ns", Hostname: "h"}); len(eps) != 0 {
		t.Errorf("endpoints survived removal: %v", eps)
	}
}

// A workload uid and a service key share one xDS name space: a resource of
// one kind replaces one of the other kind with the same name.
func TestAddressNameSharedAcrossKinds(t *testing.T) {
	s := newStore(t)
	apply(t, s, svcAddr("ns", "h"))
	s.UpdateAddresses(map[string]*workloadpb.Address{"ns/h": wlAddr("ns/h")}, nil)
	if snap := s.Snapshot(); snap.Service("ns/h") != nil || snap.WorkloadByUID("ns/h") == nil {
		t.Error("workload did not replace the service of the same name")
	}
	apply(t, s, svcAddr("ns", "h"))
	if snap := s.Snapshot(); snap.Service("ns/h") == nil || snap.WorkloadByUID("ns/h") != nil {
		t.Error("service did not replace the workload of the same name")
	}
}

func TestChangeNotification(t *testing.T) {
	s := newStore(t)
	first := s.Snapshot()
	select {
	case <-first.Changed():
		t.Fatal("Changed closed before any change")
	default:
	}
	apply(t, s, wlAddr("u1"))
	select {
	case <-first.Changed():
	default:
		t.Fatal("Changed not closed after an update")
	}
	second := s.Snapshot()
	if second.Version() != 1 || second.PolicyVersion() != 0 {
		t.Errorf("versions = %d/%d, want 1/0", second.Version(), second.PolicyVersion())
	}

	// Nothing applies: no new snapshot, nobody woken.
	s.UpdateAddresses(map[string]*workloadpb.Address{"bad": {}}, []string{"absent"})
	s.UpdateAuthorizations(nil, []string{"ns/absent"})
	if s.Snapshot() != second {
		t.Error("a push that changed nothing published a snapshot")
	}

	applyPolicies(t, s, policy("ns", "p", 0, 0))
	third := s.Snapshot()
	if third.Version() != 2 || third.PolicyVersion() != 1 {
		t.Errorf("versions = %d/%d, want 2/1", third.Version(), third.PolicyVersion())
	}
	<-second.Changed()
}

// A waiter loop as readiness or live RBAC would write it.
func TestWaitForWorkload(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found := make(chan *state.Workload, 1)
	go func() {
		for {
			snap := s.Snapshot()
			if w := snap.WorkloadByUID("late"); w != nil {
				found <- w
				return
			}
			select {
			case <-snap.Changed():
			case <-ctx.Done():
				found <- nil
				return
			}
		}
	}()
	apply(t, s, wlAddr("other"))
	apply(t, s, wlAddr("late"))
	if w := <-found; w == nil || w.UID != "late" {
		t.Fatalf("waiter got %v", w)
	}
}

func TestConcurrentReadersDuringWrites(t *testing.T) {
	s := newStore(t)
	const rounds = 200
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				snap := s.Snapshot()
				// Within one snapshot the indexes agree with each other.
				for _, w := range snap.Workloads() {
					if got := snap.WorkloadByAddr("", w.IPs[0]); got != w {
						t.Errorf("v%d: by-address %v != by-uid %v", snap.Version(), got, w)
						return
					}
				}
				if svc := snap.Service("ns/h"); svc != nil {
					n, _, _ := snap.Counts()
					if got := len(snap.Endpoints(svc)); got != n {
						t.Errorf("v%d: %d endpoints for %d workloads", snap.Version(), got, n)
						return
					}
				}
				for range snap.PoliciesFor(&state.Workload{Namespace: "ns"}) {
				}
			}
		}()
	}
	apply(t, s, svcAddr("ns", "h", withPorts(80, 8080)))
	for i := 0; i < rounds; i++ {
		uid := fmt.Sprintf("w%d", i%20)
		ip := fmt.Sprintf("10.0.%d.%d", i%20, 1+i%3)
		if i%7 == 6 {
			s.UpdateAddresses(nil, []string{uid})
		} else {
			apply(t, s, wlAddr(uid, withIPs(ip), backs("ns/h", 80, 8080)))
		}
		applyPolicies(t, s, policy("ns", fmt.Sprintf("p%d", i%5), securitypb.Scope_NAMESPACE, 0))
	}
	close(stop)
	wg.Wait()
}

func TestRejectionMetric(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s, err := state.New(state.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	s.UpdateAddresses(map[string]*workloadpb.Address{
		"a": wlAddr("a", func(w *workloadpb.Workload) { w.Addresses = [][]byte{{1}} }),
		"b": wlAddr("b", func(w *workloadpb.Workload) { w.Addresses = [][]byte{{2}} }),
		"c": {},
	}, nil)
	want := `
# HELP ztunnel_state_rejected_resources_total xDS resources rejected by validation, by resource type and reason.
# TYPE ztunnel_state_rejected_resources_total counter
ztunnel_state_rejected_resources_total{reason="bad_address",type="workload"} 2
ztunnel_state_rejected_resources_total{reason="empty_resource",type="address"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ztunnel_state_rejected_resources_total"); err != nil {
		t.Error(err)
	}
	if _, err := state.New(state.Options{Registerer: reg}); err == nil {
		t.Error("registering twice on one registry did not fail")
	}
}
