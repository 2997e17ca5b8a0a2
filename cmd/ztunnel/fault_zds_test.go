package main

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// TestFaultZDSPeerRestart: the CNI node agent restarts (its socket closes,
// a new agent listens on the same path) and replays a snapshot that lists
// cl and sv but not a third pod. The third pod's proxy is drained and its
// listeners close; cl and sv keep theirs (no proxy restart) and a client
// looping cl→sv through the whole restart sees no failed connection.
func TestFaultZDSPeerRestart(t *testing.T) {
	n := newInpodNode(t, "zzr")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gone, err := n.node.AddPod("gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.enroll(ctx, gone, "uid-gone", "gone", "gone"); err != nil {
		t.Fatal(err)
	}
	goneHBONE := netip.AddrPortFrom(gone.IP, 15008).String()
	listening := func() bool {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		defer dcancel()
		c, err := n.node.NS.Dial(dctx, "tcp", goneHBONE)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	eventually(t, "the third pod's 15008 to listen after its add", listening)
	text := scrape(t, n.node.NS)
	started0 := metricValue(text, "istio_workload_manager_proxies_started_total")

	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := n.sinkOnce("during-restart"); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
			sent.Add(1)
		}
	})

	time.Sleep(200 * time.Millisecond)
	n.cni.Close() // the agent goes away
	time.Sleep(500 * time.Millisecond)
	restartAt := time.Now()
	cni2, err := cniemu.New(cniemu.Options{Path: n.cni.Path()})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ uid, name, path string }{{"uid-cl", "cl", n.cl.Path()}, {"uid-sv", "sv", n.sv.Path()}} {
		f, err := os.Open(p.path)
		if err != nil {
			t.Fatal(err)
		}
		err = cni2.AddPod(ctx, p.uid, &zdspb.WorkloadInfo{Name: p.name, Namespace: "d", ServiceAccount: p.name}, f)
		f.Close()
		if !errors.Is(err, cniemu.ErrNoConnection) {
			t.Fatalf("caching %s in the new agent: %v", p.name, err)
		}
	}
	rctx, rcancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); cni2.Run(rctx) }()
	defer func() { rcancel(); cni2.Close(); <-runDone }()
	if err := cni2.WaitSnapshots(ctx, 1); err != nil {
		t.Fatalf("snapshot replay: %v", err)
	}
	replayed := time.Since(restartAt)
	eventually(t, "the pod missing from the snapshot to stop listening", func() bool { return !listening() })
	drained := time.Since(restartAt)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	for _, a := range cni2.Acks() {
		if a.Error != "" {
			t.Errorf("replay ack %+v has an error", a)
		}
	}
	text = scrape(t, n.node.NS)
	started := metricValue(text, "istio_workload_manager_proxies_started_total") - started0
	stopped := metricValue(text, "istio_workload_manager_proxies_stopped_total")
	active := metricValue(text, "istio_workload_manager_active_proxy_count")
	if started != 0 || stopped != 1 || active != 2 {
		t.Errorf("after replay: %v proxies started, %v stopped, %v active; want 0, 1, 2", started, stopped, active)
	}
	if failed.Load() > 0 {
		t.Errorf("%d of %d cl→sv connections failed during the agent restart; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
	if sent.Load() < 10 {
		t.Errorf("only %d connections during the restart", sent.Load())
	}
	t.Logf("fault zds-peer-restart: connections=%d failed=%d snapshot_replayed_in=%v dropped_pod_closed_in=%v proxies_restarted=%v stopped=%v active=%v",
		sent.Load(), failed.Load(), replayed.Round(time.Millisecond), drained.Round(time.Millisecond), started, stopped, active)
}
