package xds

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

func TestTypeURLsMatchTestServer(t *testing.T) {
	if TypeURLAddress != xdstest.TypeURLAddress || TypeURLAuthorization != xdstest.TypeURLAuthorization {
		t.Fatal("xdstest type URLs differ from the client's")
	}
}

func TestInitialRequests(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	c := startClient(t, srv, newFakeHandler(), func(o *Options) {
		o.Node.Metadata = map[string]string{"CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "1.28.0"}
	})
	c.waitReady(t)

	var initial []xdstest.Request
	for _, r := range srv.Requests() {
		if r.Initial() {
			initial = append(initial, r)
		}
	}
	if len(initial) != 2 {
		t.Fatalf("got %d initial requests, want 2", len(initial))
	}
	for i, want := range []string{TypeURLAddress, TypeURLAuthorization} {
		msg := initial[i].Msg
		if msg.GetTypeUrl() != want {
			t.Errorf("initial request %d: type %q, want %q", i, msg.GetTypeUrl(), want)
		}
		if got := msg.GetResourceNamesSubscribe(); !slices.Equal(got, []string{"*"}) {
			t.Errorf("%s: subscribe %q, want [*]", want, got)
		}
		if len(msg.GetInitialResourceVersions()) != 0 {
			t.Errorf("%s: first connection claims %v", want, msg.GetInitialResourceVersions())
		}
		if id := msg.GetNode().GetId(); id != "ztunnel~10.0.0.7~ztunnel-abc.istio-system~istio-system.svc.cluster.local" {
			t.Errorf("%s: node id %q", want, id)
		}
		md := msg.GetNode().GetMetadata().GetFields()
		for k, v := range map[string]string{"NAME": "ztunnel-abc", "NAMESPACE": "istio-system", "NODE_NAME": "node-1",
			"INSTANCE_IPS": "10.0.0.7", "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "1.28.0"} {
			if got := md[k].GetStringValue(); got != v {
				t.Errorf("%s: node metadata %s = %q, want %q", want, k, got, v)
			}
		}
	}
}

func TestReadyWaitsForBothTypes(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAddress("default/a", workload("default/a", "10.1.0.1"))
	srv.SetAuthorization("default/p", policy("p"))
	h := newFakeHandler()
	h.gateAuthz = make(chan struct{})
	c := startClient(t, srv, h, nil)

	// Addresses arrive and are acknowledged while Authorization is held back.
	ack, err := srv.WaitRequest(waitCtx(t), 0, func(r xdstest.Request) bool {
		return r.ACK() && r.Msg.GetTypeUrl() == TypeURLAddress
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.addressNames(); !slices.Equal(got, []string{"default/a"}) {
		t.Fatalf("addresses %v after ACK %s", got, ack.Msg.GetResponseNonce())
	}
	if c.isReady() {
		t.Fatal("ready before any Authorization response was handled")
	}
	close(h.gateAuthz)
	c.waitReady(t)
	if got := h.authzNames(); !slices.Equal(got, []string{"default/p"}) {
		t.Fatalf("authorizations %v when ready", got)
	}
}

func TestReadyWaitsForAcceptedResponse(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAuthorization("default/bad-policy", policy("bad-policy"))
	c := startClient(t, srv, newFakeHandler(), nil)

	ctx := waitCtx(t)
	isNack := func(r xdstest.Request) bool { return r.NACK() && r.Msg.GetTypeUrl() == TypeURLAuthorization }
	isAddrAck := func(r xdstest.Request) bool { return r.ACK() && r.Msg.GetTypeUrl() == TypeURLAddress }
	for _, match := range []func(xdstest.Request) bool{isNack, isAddrAck} {
		if _, err := srv.WaitRequest(ctx, 0, match); err != nil {
			t.Fatal(err)
		}
	}
	if c.isReady() {
		t.Fatal("ready although the only Authorization response was rejected")
	}
	// Replacing the bad policy with a good one in one push is accepted.
	srv.Push(TypeURLAuthorization, map[string]proto.Message{"default/p": policy("p")}, []string{"default/bad-policy"})
	c.waitReady(t)
}

func TestUpdateAndRemove(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAddress("default/a", workload("default/a", "10.1.0.1"))
	srv.SetAddress("default/b", workload("default/b", "10.1.0.2"))
	h := newFakeHandler()
	c := startClient(t, srv, h, nil)
	c.waitReady(t)
	waitAnswered(t, srv)
	if got := h.addressNames(); !slices.Equal(got, []string{"default/a", "default/b"}) {
		t.Fatalf("initial addresses %v", got)
	}

	from := srv.RequestCount()
	srv.Push(TypeURLAddress, map[string]proto.Message{"default/a": workload("default/a", "10.1.0.9")}, []string{"default/b"})
	h.waitFor(t, "update of a and removal of b", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		a := h.addrs["default/a"]
		_, hasB := h.addrs["default/b"]
		return a != nil && a.GetWorkload().GetAddresses()[0][3] == 9 && !hasB
	})
	if _, err := srv.WaitRequest(waitCtx(t), from, func(r xdstest.Request) bool {
		return r.ACK() && r.Msg.GetTypeUrl() == TypeURLAddress
	}); err != nil {
		t.Fatal(err)
	}
	if got := c.counter(t, "ztunnel_xds_resources", map[string]string{"url": TypeURLAddress}); got != 1 {
		t.Errorf("ztunnel_xds_resources{Address} = %v, want 1", got)
	}
	if got := c.counter(t, "istio_xds_message_total", map[string]string{"url": TypeURLAddress}); got != 2 {
		t.Errorf("istio_xds_message_total{Address} = %v, want 2", got)
	}
}

func TestNACK(t *testing.T) {
	tests := []struct {
		name     string
		typeURL  string
		push     map[string]proto.Message
		wantMsg  string // exact message, or a prefix when it ends in "…"
		wantKept []string
	}{
		{
			name:    "undecodable address bytes",
			typeURL: TypeURLAddress,
			push: map[string]proto.Message{
				"default/garbage": xdstest.Raw([]byte{0xff, 0xff, 0xff}),
				"default/good":    workload("default/good", "10.2.0.1"),
			},
			wantMsg:  "default/garbage: cannot decode resource: …",
			wantKept: []string{"default/good"},
		},
		{
			name:    "address rejected by the handler",
			typeURL: TypeURLAddress,
			push: map[string]proto.Message{
				"default/bad-one": workload("default/bad-one", "10.2.0.2"),
				"default/good":    workload("default/good", "10.2.0.1"),
			},
			wantMsg:  "default/bad-one: " + errFakeRejected.Error(),
			wantKept: []string{"default/good"},
		},
		{
			name:    "two authorizations rejected, listed in order",
			typeURL: TypeURLAuthorization,
			push: map[string]proto.Message{
				"ns/z-bad":  policy("z-bad"),
				"ns/a-bad":  policy("a-bad"),
				"ns/policy": policy("policy"),
			},
			wantMsg:  "ns/a-bad: " + errFakeRejected.Error() + "; ns/z-bad: " + errFakeRejected.Error(),
			wantKept: []string{"ns/policy"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			srv := xdstest.NewServer(t, xdstest.Options{})
			h := newFakeHandler()
			c := startClient(t, srv, h, nil)
			c.waitReady(t)
			waitAnswered(t, srv)

			from := srv.RequestCount()
			srv.Push(tt.typeURL, tt.push, nil)
			nack, err := srv.WaitRequest(waitCtx(t), from, func(r xdstest.Request) bool { return !r.Initial() })
			if err != nil {
				t.Fatal(err)
			}
			if !nack.NACK() {
				t.Fatalf("got ACK for a push with bad resources")
			}
			detail := nack.Msg.GetErrorDetail()
			if codes.Code(detail.GetCode()) != codes.InvalidArgument {
				t.Errorf("error_detail code %v, want InvalidArgument", codes.Code(detail.GetCode()))
			}
			if prefix, ok := strings.CutSuffix(tt.wantMsg, "…"); ok {
				if !strings.HasPrefix(detail.GetMessage(), prefix) || len(detail.GetMessage()) == len(prefix) {
					t.Errorf("error_detail message %q, want %q followed by the decode error", detail.GetMessage(), prefix)
				}
			} else if detail.GetMessage() != tt.wantMsg {
				t.Errorf("error_detail message %q, want %q", detail.GetMessage(), tt.wantMsg)
			}
			got := h.addressNames()
			if tt.typeURL == TypeURLAuthorization {
				got = h.authzNames()
			}
			if !slices.Equal(got, tt.wantKept) {
				t.Errorf("handler holds %v, want %v (valid resources of a NACKed push apply)", got, tt.wantKept)
			}
			if n := c.counter(t, "ztunnel_xds_nacks_total", map[string]string{"url": tt.typeURL}); n != 1 {
				t.Errorf("ztunnel_xds_nacks_total = %v, want 1", n)
			}
		})
	}
}

func TestReconnectResumesFromHeldVersions(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAddress("default/a", workload("default/a", "10.1.0.1"))
	srv.SetAddress("default/b", workload("default/b", "10.1.0.2"))
	srv.SetAddress("default/bad-x", workload("default/bad-x", "10.1.0.3"))
	srv.SetAuthorization("default/p", policy("p"))
	h := newFakeHandler()
	c := startClient(t, srv, h, nil)
	waitAnswered(t, srv)
	ctx := waitCtx(t)
	firstStream := srv.Requests()[0].Stream

	// While the client is cut off: b is removed, c is added, a is unchanged.
	srv.Stop()
	srv.Remove(TypeURLAddress, "default/b")
	srv.SetAddress("default/c", workload("default/c", "10.1.0.4"))
	from := srv.RequestCount()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}

	claims := map[string][]string{}
	for _, u := range []string{TypeURLAddress, TypeURLAuthorization} {
		r, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool {
			return r.Initial() && r.Msg.GetTypeUrl() == u && r.Stream != firstStream
		})
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range r.Msg.GetInitialResourceVersions() {
			if v == "" {
				t.Errorf("%s: empty version claimed for %s", u, name)
			}
		}
		claims[u] = slices.Sorted(maps.Keys(r.Msg.GetInitialResourceVersions()))
	}
	// The rejected bad-x is not claimed, so the server sends it again.
	if want := []string{"default/a", "default/b"}; !slices.Equal(claims[TypeURLAddress], want) {
		t.Errorf("Address initial_resource_versions %v, want %v", claims[TypeURLAddress], want)
	}
	if want := []string{"default/p"}; !slices.Equal(claims[TypeURLAuthorization], want) {
		t.Errorf("Authorization initial_resource_versions %v, want %v", claims[TypeURLAuthorization], want)
	}

	h.waitFor(t, "addresses to converge to a, c", func() bool {
		return slices.Equal(h.addressNames(), []string{"default/a", "default/c"})
	})
	// A nack for the re-sent bad-x shows the server retried it.
	if _, err := srv.WaitRequest(ctx, from, func(r xdstest.Request) bool {
		return r.NACK() && strings.Contains(r.Msg.GetErrorDetail().GetMessage(), "default/bad-x")
	}); err != nil {
		t.Fatal(err)
	}
	if n := h.upsertCount("default/a"); n != 1 {
		t.Errorf("unchanged default/a delivered %d times, want 1 (initial versions ignored?)", n)
	}
	// Stop drops the connection abruptly: depending on timing the client
	// reads EOF/GOAWAY (Reconnect) or a reset (Error); either must count.
	reconnects := c.counter(t, "istio_xds_connection_terminations_total", map[string]string{"reason": string(reasonReconnect)})
	errs := c.counter(t, "istio_xds_connection_terminations_total", map[string]string{"reason": string(reasonError)})
	if reconnects+errs < 1 {
		t.Errorf("no termination counted for the dropped stream (Reconnect %v, Error %v)", reconnects, errs)
	}
}

func TestToken(t *testing.T) {
	tests := []struct {
		name      string
		token     string
		wantReady bool
	}{
		{name: "accepted token", token: "s3cret", wantReady: true},
		{name: "wrong token", token: "guess", wantReady: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			srv := xdstest.NewServer(t, xdstest.Options{Token: "s3cret"})
			attempts := make(chan struct{}, 100)
			var calls atomic.Int32
			c := startClient(t, srv, newFakeHandler(), func(o *Options) {
				o.Token = func() (string, error) {
					calls.Add(1)
					select {
					case attempts <- struct{}{}:
					default:
					}
					return tt.token + "\n", nil // token files end in a newline
				}
				o.Headers = map[string]string{"X-Team": "mesh"}
				o.Node.ClusterID = "Kubernetes"
			})
			if tt.wantReady {
				c.waitReady(t)
				r := srv.Requests()[0]
				for k, v := range map[string]string{"authorization": "Bearer s3cret", "clusterid": "Kubernetes", "x-team": "mesh"} {
					if got := r.Metadata.Get(k); !slices.Equal(got, []string{v}) {
						t.Errorf("stream metadata %s = %q, want %q", k, got, v)
					}
				}
				return
			}
			// A refused stream is retried, reading the token again each time.
			for range 3 {
				select {
				case <-attempts:
				case <-waitCtx(t).Done():
					t.Fatal("client did not retry")
				}
			}
			if c.isReady() {
				t.Fatal("ready with a refused token")
			}
			if calls.Load() < 3 {
				t.Fatalf("token read %d times", calls.Load())
			}
		})
	}
}

func TestRunTwice(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	c := startClient(t, srv, newFakeHandler(), nil)
	c.waitReady(t)
	if err := c.Run(t.Context()); err == nil {
		t.Fatal("second Run did not fail")
	}
}
