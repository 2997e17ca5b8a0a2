package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

const (
	addressType = "type.googleapis.com/istio.workload.Address"
	authzType   = "type.googleapis.com/istio.security.Authorization"
)

func testWorkload(uid, name string, ip byte) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid: uid, Name: name, Namespace: "ns", ServiceAccount: name,
		Addresses: [][]byte{{10, 1, 0, ip}}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
	}}}
}

// dumpUIDs returns the workload uids and policy names in config_dump.
func dumpUIDs(t *testing.T, admin string) (workloads, policies []string) {
	t.Helper()
	_, body := get(t, "http://"+admin+"/config_dump")
	var d struct {
		Workloads []struct{ UID string }  `json:"workloads"`
		Policies  []struct{ Name string } `json:"policies"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	for _, w := range d.Workloads {
		workloads = append(workloads, w.UID)
	}
	for _, p := range d.Policies {
		policies = append(policies, p.Name)
	}
	return workloads, policies
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestXDSEndToEnd runs the real binary against a go-control-plane delta
// server: pushes add, update and remove workloads and policies and the
// config_dump follows; a malformed resource is NACKed with a readable error
// while the rest keeps serving; the server restarts and state converges.
func TestXDSEndToEnd(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAddress("c//Pod/ns/a", testWorkload("c//Pod/ns/a", "a", 1))
	srv.SetAuthorization("ns/allow-a", &securitypb.Authorization{Name: "allow-a", Namespace: "ns", Scope: securitypb.Scope_NAMESPACE})
	p := startZtunnel(t, "XDS_ADDRESS="+srv.URL(), "FAKE_CA=true", "PROXY_MODE=shared")
	admin := p.addrs["admin"]
	has := func(list []string, v string) bool {
		for _, x := range list {
			if x == v {
				return true
			}
		}
		return false
	}
	eventually(t, "initial push in config_dump", func() bool {
		w, pol := dumpUIDs(t, admin)
		return has(w, "c//Pod/ns/a") && has(pol, "allow-a")
	})

	srv.SetAddress("c//Pod/ns/b", testWorkload("c//Pod/ns/b", "b", 2))
	srv.Remove(authzType, "ns/allow-a")
	eventually(t, "add b and remove the policy", func() bool {
		w, pol := dumpUIDs(t, admin)
		return has(w, "c//Pod/ns/b") && !has(pol, "allow-a")
	})

	// A workload with a 3-byte address is rejected alone.
	from := srv.RequestCount()
	bad := testWorkload("c//Pod/ns/bad", "bad", 3)
	bad.GetWorkload().Addresses = [][]byte{{10, 1, 0}}
	srv.SetAddress("c//Pod/ns/bad", bad)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	nack, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool { return r.NACK() })
	if err != nil {
		t.Fatalf("no NACK for a malformed workload: %v", err)
	}
	if msg := nack.Msg.GetErrorDetail().GetMessage(); !strings.Contains(msg, "c//Pod/ns/bad") || !strings.Contains(msg, "want 4 or 16 bytes, got 3") {
		t.Fatalf("NACK error_detail = %q, want the resource name and the reason", msg)
	}
	if w, _ := dumpUIDs(t, admin); !has(w, "c//Pod/ns/a") || !has(w, "c//Pod/ns/b") || has(w, "c//Pod/ns/bad") {
		t.Fatalf("after NACK the dump has %v, want a and b only", w)
	}

	// istiod goes away; meanwhile a is removed and c added; it comes back.
	srv.Stop()
	srv.Remove(addressType, "c//Pod/ns/a")
	srv.Remove(addressType, "c//Pod/ns/bad")
	srv.SetAddress("c//Pod/ns/c", testWorkload("c//Pod/ns/c", "c", 4))
	time.Sleep(300 * time.Millisecond)
	if w, _ := dumpUIDs(t, admin); !has(w, "c//Pod/ns/a") {
		t.Fatalf("state lost while istiod was down: %v", w)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "state to converge after reconnect", func() bool {
		w, _ := dumpUIDs(t, admin)
		return !has(w, "c//Pod/ns/a") && has(w, "c//Pod/ns/b") && has(w, "c//Pod/ns/c")
	})
}
