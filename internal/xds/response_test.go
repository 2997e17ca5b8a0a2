package xds

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// res builds a Resource of typeURL whose body is msg (or raw bytes).
func res(t testing.TB, typeURL, name, version string, body any) *discovery.Resource {
	t.Helper()
	var value []byte
	switch b := body.(type) {
	case []byte:
		value = b
	case proto.Message:
		var err error
		if value, err = proto.Marshal(b); err != nil {
			t.Fatal(err)
		}
	case nil:
		return &discovery.Resource{Name: name, Version: version}
	}
	return &discovery.Resource{Name: name, Version: version, Resource: &anypb.Any{TypeUrl: typeURL, Value: value}}
}

func TestApply(t *testing.T) {
	type step struct {
		resp        *discovery.DeltaDiscoveryResponse
		wantNACK    string // "" means ACK; else a substring of the message
		wantHeld    map[string]string
		wantHandler []string
	}
	a := func(name, version string) *discovery.Resource {
		return res(t, TypeURLAddress, name, version, workload(name, "10.0.0.1"))
	}
	addrResp := func(nonce string, removed []string, rs ...*discovery.Resource) *discovery.DeltaDiscoveryResponse {
		return &discovery.DeltaDiscoveryResponse{TypeUrl: TypeURLAddress, Nonce: nonce, Resources: rs, RemovedResources: removed}
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "all accepted",
			steps: []step{{
				resp:        addrResp("1", nil, a("x", "v1"), a("y", "v1")),
				wantHeld:    map[string]string{"x": "v1", "y": "v1"},
				wantHandler: []string{"x", "y"},
			}},
		},
		{
			name: "undecodable resource is not held, the rest apply",
			steps: []step{{
				resp:        addrResp("1", nil, a("x", "v1"), res(t, TypeURLAddress, "junk", "v1", []byte{0xff})),
				wantNACK:    "junk: cannot decode resource: ",
				wantHeld:    map[string]string{"x": "v1"},
				wantHandler: []string{"x"},
			}},
		},
		{
			name: "resource without a body",
			steps: []step{{
				resp:     addrResp("1", nil, res(t, TypeURLAddress, "empty", "v1", nil)),
				wantNACK: "empty: resource has no body",
				wantHeld: map[string]string{},
			}},
		},
		{
			name: "body of another type",
			steps: []step{{
				resp:     addrResp("1", nil, res(t, TypeURLAuthorization, "p", "v1", policy("p"))),
				wantNACK: `p: resource type does not match the response type: got "` + TypeURLAuthorization + `"`,
				wantHeld: map[string]string{},
			}},
		},
		{
			name: "rejected update keeps the old version so a reconnect retries it",
			steps: []step{
				{
					resp:     addrResp("1", nil, res(t, TypeURLAddress, "w", "v1", workload("w", "10.0.0.1"))),
					wantHeld: map[string]string{"w": "v1"}, wantHandler: []string{"w"},
				},
				{
					resp:     addrResp("2", nil, res(t, TypeURLAddress, "w", "v2", []byte{0xff})),
					wantNACK: "w: cannot decode", wantHeld: map[string]string{"w": "v1"}, wantHandler: []string{"w"},
				},
			},
		},
		{
			name: "removal drops the version",
			steps: []step{
				{resp: addrResp("1", nil, a("x", "v1"), a("y", "v1")), wantHeld: map[string]string{"x": "v1", "y": "v1"}, wantHandler: []string{"x", "y"}},
				{resp: addrResp("2", []string{"y", "never-held"}), wantHeld: map[string]string{"x": "v1"}, wantHandler: []string{"x"}},
			},
		},
		{
			name: "handler rejection by name",
			steps: []step{{
				resp:        addrResp("1", nil, a("bad-a", "v1"), a("ok", "v3")),
				wantNACK:    "bad-a: " + errFakeRejected.Error(),
				wantHeld:    map[string]string{"ok": "v3"},
				wantHandler: []string{"ok"},
			}},
		},
		{
			name: "repeated name: last occurrence wins",
			steps: []step{{
				resp:        addrResp("1", nil, res(t, TypeURLAddress, "x", "v1", []byte{0xff}), a("x", "v2")),
				wantHeld:    map[string]string{"x": "v2"},
				wantHandler: []string{"x"},
			}},
		},
		{
			name: "unsubscribed type",
			steps: []step{{
				resp:     &discovery.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "1"},
				wantNACK: "type.googleapis.com/envoy.config.cluster.v3.Cluster: type URL is not subscribed by this client",
				wantHeld: map[string]string{},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHandler()
			vt := newVersionTracker()
			for i, st := range tt.steps {
				out := vt.apply(h, st.resp)
				req := out.request()
				if req.GetTypeUrl() != st.resp.GetTypeUrl() || req.GetResponseNonce() != st.resp.GetNonce() {
					t.Errorf("step %d: answer %q/%q, want type and nonce of the response", i, req.GetTypeUrl(), req.GetResponseNonce())
				}
				switch detail := req.GetErrorDetail(); {
				case st.wantNACK == "" && detail != nil:
					t.Errorf("step %d: NACK %q, want ACK", i, detail.GetMessage())
				case st.wantNACK != "" && detail == nil:
					t.Errorf("step %d: ACK, want NACK containing %q", i, st.wantNACK)
				case st.wantNACK != "":
					if !strings.Contains(detail.GetMessage(), st.wantNACK) {
						t.Errorf("step %d: NACK %q, want it to contain %q", i, detail.GetMessage(), st.wantNACK)
					}
					if codes.Code(detail.GetCode()) != codes.InvalidArgument {
						t.Errorf("step %d: code %v", i, codes.Code(detail.GetCode()))
					}
				}
				if got := vt.initial(TypeURLAddress); !maps.Equal(got, st.wantHeld) {
					t.Errorf("step %d: held %v, want %v", i, got, st.wantHeld)
				}
				if got := h.addressNames(); !slices.Equal(got, st.wantHandler) {
					t.Errorf("step %d: handler has %v, want %v", i, got, st.wantHandler)
				}
			}
		})
	}
}

// refuseRemovals rejects every removal; apply must then keep claiming the
// resource so that a reconnect brings the removal again.
type refuseRemovals struct{ *fakeHandler }

func (r refuseRemovals) UpdateAddresses(ups map[string]*workloadpb.Address, removes []string) map[string]error {
	out := r.fakeHandler.UpdateAddresses(ups, nil)
	for _, n := range removes {
		if out == nil {
			out = map[string]error{}
		}
		out[n] = errors.New("still referenced")
	}
	return out
}

func TestApplyRejectedRemovalStaysClaimed(t *testing.T) {
	h := refuseRemovals{newFakeHandler()}
	vt := newVersionTracker()
	vt.apply(h, &discovery.DeltaDiscoveryResponse{TypeUrl: TypeURLAddress, Nonce: "1",
		Resources: []*discovery.Resource{res(t, TypeURLAddress, "x", "v1", workload("x", "10.0.0.1"))}})
	out := vt.apply(h, &discovery.DeltaDiscoveryResponse{TypeUrl: TypeURLAddress, Nonce: "2", RemovedResources: []string{"x"}})
	if !out.nack() || out.message() != "x: still referenced" {
		t.Fatalf("message %q", out.message())
	}
	if got := vt.initial(TypeURLAddress); !maps.Equal(got, map[string]string{"x": "v1"}) {
		t.Fatalf("held %v, want x still claimed", got)
	}
}

func TestNackMessage(t *testing.T) {
	many := map[string]error{}
	for i := range maxNackEntries + 7 {
		many[fmt.Sprintf("r%03d", i)] = errDecode
	}
	tests := []struct {
		name     string
		rejected map[string]error
		want     string
	}{
		{name: "one", rejected: map[string]error{"ns/a": errNoBody}, want: "ns/a: resource has no body"},
		{name: "sorted", rejected: map[string]error{"b": errNoBody, "a": errDecode}, want: "a: cannot decode resource; b: resource has no body"},
		{name: "odd names quoted", rejected: map[string]error{"": errNoBody, "x y": errNoBody}, want: `"": resource has no body; "x y": resource has no body`},
		{name: "capped", rejected: many, want: "; and 7 more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &outcome{typeURL: TypeURLAddress, rejected: tt.rejected}
			got := o.message()
			if tt.name == "capped" {
				if !strings.HasSuffix(got, tt.want) || strings.Count(got, ": cannot decode") != maxNackEntries {
					t.Fatalf("message %q", got)
				}
				return
			}
			if got != tt.want {
				t.Fatalf("message %q, want %q", got, tt.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name   string
		jitter float64
		resets []bool
		want   []time.Duration
	}{
		{name: "doubling to the cap, no jitter", jitter: 0,
			resets: []bool{false, false, false, false, false},
			want:   []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 400 * ms}},
		{name: "full jitter approaches the whole delay", jitter: 0.999,
			resets: []bool{false, false},
			want:   []time.Duration{99*ms + 950*time.Microsecond, 199*ms + 900*time.Microsecond}},
		{name: "healthy stream resets", jitter: 0,
			resets: []bool{false, false, false, true, false},
			want:   []time.Duration{50 * ms, 100 * ms, 200 * ms, 50 * ms, 100 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBackoff(100*ms, 800*ms)
			b.jitter = func() float64 { return tt.jitter }
			for i, reset := range tt.resets {
				if got := b.next(reset); got != tt.want[i] {
					t.Errorf("attempt %d: %v, want %v", i, got, tt.want[i])
				}
			}
		})
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		healthy bool
		want    terminationReason
	}{
		{name: "clean end", err: io.EOF, healthy: true, want: reasonComplete},
		{name: "server went away", err: status.Error(codes.Unavailable, "error reading from server: EOF"), healthy: true, want: reasonReconnect},
		{name: "goaway", err: status.Error(codes.Unavailable, "closing transport due to: connection error: desc = \"error reading from server: EOF\", received prior goaway"), healthy: true, want: reasonReconnect},
		{name: "never connected", err: status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused\""), want: reasonConnectionError},
		{name: "unavailable for another reason", err: status.Error(codes.Unavailable, "overloaded"), healthy: true, want: reasonError},
		{name: "refused token", err: status.Error(codes.Unauthenticated, "bad token"), want: reasonError},
		{name: "deadline", err: status.Error(codes.DeadlineExceeded, "max age"), healthy: true, want: reasonReconnect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := classify(tt.err, tt.healthy)
			if got != tt.want {
				t.Fatalf("reason %s, want %s (err %v)", got, tt.want, err)
			}
			if (got == reasonComplete) != (err == nil) {
				t.Fatalf("err %v for reason %s", err, got)
			}
		})
	}
}

func TestParseAddress(t *testing.T) {
	tests := []struct {
		addr       string
		wantTarget string
		wantTLS    bool
		wantHost   string
		wantErr    string
	}{
		{addr: "https://istiod.istio-system.svc:15012", wantTarget: "istiod.istio-system.svc:15012", wantTLS: true, wantHost: "istiod.istio-system.svc"},
		{addr: "http://127.0.0.1:15010", wantTarget: "127.0.0.1:15010", wantHost: "127.0.0.1"},
		{addr: "https://istiod", wantTarget: "istiod:443", wantTLS: true, wantHost: "istiod"},
		{addr: "https://[fd00::1]:15012", wantTarget: "[fd00::1]:15012", wantTLS: true, wantHost: "fd00::1"},
		{addr: "istiod:15012", wantErr: "scheme must be https or http"},
		{addr: "grpc://istiod:15012", wantErr: "scheme must be https or http"},
		{addr: "https://:15012", wantErr: "missing host"},
		{addr: "https://istiod:15012/path", wantErr: "only scheme://host:port"},
		{addr: "", wantErr: "scheme must be"},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			target, useTLS, host, err := parseAddress(tt.addr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || target != tt.wantTarget || useTLS != tt.wantTLS || host != tt.wantHost {
				t.Fatalf("got %q %v %q %v", target, useTLS, host, err)
			}
		})
	}
}

func TestNewRequiresHandler(t *testing.T) {
	if _, err := New(Options{Address: "http://127.0.0.1:1"}); err == nil {
		t.Fatal("New without Handler succeeded")
	}
}
