package xds

import (
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzApply feeds network bytes through the response path: first as a whole
// DeltaDiscoveryResponse, then as the body of one resource of each type.
// It must never panic, must answer every response with the response's own
// nonce, and must never claim a version for a resource it rejected.
func FuzzApply(f *testing.F) {
	good, err := proto.Marshal(workload("default/a", "10.0.0.1"))
	if err != nil {
		f.Fatal(err)
	}
	resp, err := proto.Marshal(&discovery.DeltaDiscoveryResponse{
		TypeUrl: TypeURLAddress, Nonce: "n",
		Resources:        []*discovery.Resource{{Name: "default/a", Version: "1", Resource: &anypb.Any{TypeUrl: TypeURLAddress, Value: good}}},
		RemovedResources: []string{"default/b"},
	})
	if err != nil {
		f.Fatal(err)
	}
	pol, err := proto.Marshal(policy("p"))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{good, resp, pol, {0xff}, {0x0a, 0x80}, nil} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []*discovery.DeltaDiscoveryResponse
		var whole discovery.DeltaDiscoveryResponse
		if proto.Unmarshal(data, &whole) == nil {
			msgs = append(msgs, &whole)
		}
		for _, u := range subscribedTypes {
			msgs = append(msgs, &discovery.DeltaDiscoveryResponse{TypeUrl: u, Nonce: "x", Resources: []*discovery.Resource{
				{Name: "fuzzed", Version: "v", Resource: &anypb.Any{TypeUrl: u, Value: data}},
			}})
		}
		h := newFakeHandler()
		vt := newVersionTracker()
		for _, m := range msgs {
			before := vt.initial(m.GetTypeUrl())
			out := vt.apply(h, m)
			req := out.request()
			if req.GetResponseNonce() != m.GetNonce() || req.GetTypeUrl() != m.GetTypeUrl() {
				t.Fatalf("answer %q/%q for response %q/%q", req.GetTypeUrl(), req.GetResponseNonce(), m.GetTypeUrl(), m.GetNonce())
			}
			if out.nack() && strings.TrimSpace(req.GetErrorDetail().GetMessage()) == "" {
				t.Fatal("NACK without a message")
			}
			// A rejected resource keeps exactly the claim it had before.
			after := vt.initial(m.GetTypeUrl())
			for name := range out.rejected {
				if before[name] != after[name] {
					t.Fatalf("rejected %q: claim changed from %q to %q", name, before[name], after[name])
				}
			}
		}
	})
}
