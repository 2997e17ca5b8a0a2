package xds

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

var _ Handler = (*state.Store)(nil)

// TestWithStateStore runs the client against the real state store: a valid
// workload is served, and one whose resource name disagrees with its uid is
// NACKed with the store's reason while the valid one stays.
func TestWithStateStore(t *testing.T) {
	checkLeaks(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Push(TypeURLAddress, map[string]proto.Message{
		"Kubernetes//Pod/default/good": workload("Kubernetes//Pod/default/good", "10.3.0.1"),
		"wrong-name":                   workload("Kubernetes//Pod/default/other", "10.3.0.2"),
	}, nil)
	st, err := state.New(state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Address: srv.URL(), Handler: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := waitCtx(t)
	done := make(chan error, 1)
	runCtx, cancel := context.WithCancel(ctx)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	nack, err := srv.WaitRequest(ctx, 0, func(r xdstest.Request) bool { return r.NACK() })
	if err != nil {
		t.Fatal(err)
	}
	msg := nack.Msg.GetErrorDetail().GetMessage()
	if !strings.HasPrefix(msg, "wrong-name: ") || strings.Contains(msg, "default/good") {
		t.Fatalf("NACK message %q, want only wrong-name rejected", msg)
	}
	snap := st.Snapshot()
	for snap.WorkloadByAddr("", netip.MustParseAddr("10.3.0.1")) == nil {
		select {
		case <-snap.Changed():
			snap = st.Snapshot()
		case <-time.After(testTimeout):
			t.Fatal("valid workload never reached the store")
		}
	}
	if snap.WorkloadByAddr("", netip.MustParseAddr("10.3.0.2")) != nil {
		t.Fatal("rejected workload is served")
	}
}
