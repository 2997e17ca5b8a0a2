package xds

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// testTimeout bounds every wait in these tests; a healthy run needs well
// under a second.
const testTimeout = 10 * time.Second

var errFakeRejected = errors.New("rejected by fake handler: name contains \"bad\"")

// fakeHandler is a Handler that keeps what it is given and rejects every
// upserted resource whose name contains "bad" (removals always succeed). Tests wait on it with waitFor.
type fakeHandler struct {
	// gateAuthz, if set, is received from before each UpdateAuthorizations
	// call is applied, so a test can hold that type back.
	gateAuthz chan struct{}

	mu      sync.Mutex
	addrs   map[string]*workloadpb.Address
	authz   map[string]*securitypb.Authorization
	upserts map[string]int // resource name → times upserted
	changed chan struct{}  // closed and replaced after every call
}

func newFakeHandler() *fakeHandler {
	return &fakeHandler{
		addrs:   make(map[string]*workloadpb.Address),
		authz:   make(map[string]*securitypb.Authorization),
		upserts: make(map[string]int),
		changed: make(chan struct{}),
	}
}

func fakeUpdate[T any](h *fakeHandler, store map[string]T, ups map[string]T, removes []string) map[string]error {
	h.mu.Lock()
	defer h.mu.Unlock()
	defer func() {
		close(h.changed)
		h.changed = make(chan struct{})
	}()
	var rejected map[string]error
	reject := func(name string) bool {
		if !strings.Contains(name, "bad") {
			return false
		}
		if rejected == nil {
			rejected = make(map[string]error)
		}
		rejected[name] = errFakeRejected
		return true
	}
	for name, v := range ups {
		if reject(name) {
			continue
		}
		store[name] = v
		h.upserts[name]++
	}
	for _, name := range removes {
		delete(store, name)
	}
	return rejected
}

func (h *fakeHandler) UpdateAddresses(ups map[string]*workloadpb.Address, removes []string) map[string]error {
	return fakeUpdate(h, h.addrs, ups, removes)
}

func (h *fakeHandler) UpdateAuthorizations(ups map[string]*securitypb.Authorization, removes []string) map[string]error {
	if h.gateAuthz != nil {
		<-h.gateAuthz
	}
	return fakeUpdate(h, h.authz, ups, removes)
}

func (h *fakeHandler) ReplaceAddresses(all map[string]*workloadpb.Address) map[string]error {
	h.mu.Lock()
	old := slices.Collect(maps.Keys(h.addrs))
	h.mu.Unlock()
	return h.UpdateAddresses(all, old)
}

func (h *fakeHandler) ReplaceAuthorizations(all map[string]*securitypb.Authorization) map[string]error {
	h.mu.Lock()
	old := slices.Collect(maps.Keys(h.authz))
	h.mu.Unlock()
	return h.UpdateAuthorizations(all, old)
}

// addressNames is the sorted set of Address names held.
func (h *fakeHandler) addressNames() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.addrs))
}

func (h *fakeHandler) authzNames() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.authz))
}

func (h *fakeHandler) upsertCount(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.upserts[name]
}

// waitFor blocks until cond holds, re-checking after every handler call.
func (h *fakeHandler) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for {
		h.mu.Lock()
		ch := h.changed
		h.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// checkLeaks registers a goroutine-leak check that runs after every other
// cleanup of the test (so after the client and server have stopped).
func checkLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

type testClient struct {
	*Client
	h   *fakeHandler
	reg *prometheus.Registry
}

// startClient runs a Client against srv until the test ends. configure
// may adjust the options (it may be nil).
func startClient(t *testing.T, srv *xdstest.Server, h *fakeHandler, configure func(*Options)) *testClient {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := Options{
		Address:    srv.URL(),
		Handler:    h,
		Logger:     testLogger(t),
		Registerer: reg,
		Node:       NodeInfo{IP: "10.0.0.7", PodName: "ztunnel-abc", PodNamespace: "istio-system", NodeName: "node-1"},
	}
	if configure != nil {
		configure(&opts)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Short delays keep reconnect tests quick; the policy itself is tested
	// in TestBackoff.
	c.newBackoff = func() *backoff { return newBackoff(5*time.Millisecond, 50*time.Millisecond) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &testClient{Client: c, h: h, reg: reg}
}

func (c *testClient) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-c.Ready():
	case <-time.After(testTimeout):
		t.Fatal("client did not become ready")
	}
}

func (c *testClient) isReady() bool {
	select {
	case <-c.Ready():
		return true
	default:
		return false
	}
}

// counter reads one sample of a counter or gauge from the client's registry.
func (c *testClient) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := c.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metric
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// waitAnswered waits until the server has received an ACK or NACK of each
// type, so that RequestCount taken afterwards excludes those answers.
func waitAnswered(t *testing.T, srv *xdstest.Server) {
	t.Helper()
	ctx := waitCtx(t)
	for _, u := range subscribedTypes {
		if _, err := srv.WaitRequest(ctx, 0, func(r xdstest.Request) bool {
			return !r.Initial() && r.Msg.GetTypeUrl() == u
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testLogger writes to the test log while the test runs, and nowhere once
// it has finished.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

var _ io.Writer = (*testWriter)(nil)

// workload builds an Address resource holding a workload named uid.
func workload(uid, ip string) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid:       uid,
		Name:      uid,
		Namespace: "default",
		Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()},
	}}}
}

func policy(name string) *securitypb.Authorization {
	return &securitypb.Authorization{Name: name, Namespace: "default", Action: securitypb.Action_DENY}
}
