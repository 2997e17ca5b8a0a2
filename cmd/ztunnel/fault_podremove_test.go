package main

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
)

// TestFaultPodRemovedMidStream: a pod holds 1,000 connections through
// ztunnel to sv, each mid-stream (written to, no reply yet), when the CNI
// agent removes it. Every one of them ends well within the grace period,
// ztunnel's fds and goroutines return to where they were before the pod
// came, and a client in another pod sees no failure meanwhile.
func TestFaultPodRemovedMidStream(t *testing.T) {
	const conns = 1000
	const grace = 6 * time.Second // TERMINATION_GRACE_PERIOD_SECONDS
	n := newInpodNode(t, "zpr", "TERMINATION_GRACE_PERIOD_SECONDS=6", "STATS_ADDR=127.0.0.1:15020")
	pid := n.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := n.sinkOnce("warm"); err != nil {
		t.Fatal(err)
	}
	goroutines := func() float64 { return metricValue(scrape(t, n.node.NS), "go_goroutines") }
	time.Sleep(200 * time.Millisecond)
	fds0, g0 := procCount(t, pid, "fd"), goroutines()

	bz, err := n.node.AddPod("bz")
	if err != nil {
		t.Fatal(err)
	}
	if err := cniemu.InstallRedirect(bz.Path(), cniemu.RedirectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := n.enroll(ctx, bz, "uid-bz", "bz", "bz"); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(n.sv.IP, 7100).String()
	var held []net.Conn
	for i := range conns {
		c, err := bz.Dial(ctx, "tcp", dst)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("mid-stream")); err != nil {
			t.Fatalf("connection %d write: %v", i, err)
		}
		held = append(held, c)
	}
	eventually(t, "all connections through ztunnel", func() bool {
		return procCount(t, pid, "fd") >= fds0+conns
	})
	fdsBusy, gBusy := procCount(t, pid, "fd"), goroutines()

	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent.Add(1)
			if n.sinkOnce("steady") != nil {
				failed.Add(1)
			}
		}
	})

	removeAt := time.Now()
	if err := n.cni.RemovePod(ctx, "uid-bz"); err != nil {
		t.Fatal(err)
	}
	ackIn := time.Since(removeAt)
	var ended atomic.Int64
	var slowest atomic.Int64
	var ends sync.Map
	var rg sync.WaitGroup
	for _, c := range held {
		rg.Go(func() {
			c.SetReadDeadline(removeAt.Add(grace))
			_, err := c.Read(make([]byte, 64))
			if err == nil {
				return // answered: the connection was not cut
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return
			}
			ended.Add(1)
			k := endKind(err)
			v, _ := ends.LoadOrStore(k, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
			for d := int64(time.Since(removeAt)); ; {
				cur := slowest.Load()
				if d <= cur || slowest.CompareAndSwap(cur, d) {
					break
				}
			}
		})
	}
	rg.Wait()
	close(stop)
	wg.Wait()
	n.cluster.RemovePod(bz)
	if ended.Load() != conns {
		t.Errorf("%d of %d connections ended within the grace period %v after the pod was removed", ended.Load(), conns, grace)
	}
	var fds int
	var g float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		fds, g = procCount(t, pid, "fd"), goroutines()
		if fds <= fds0 && g <= g0+2 {
			break
		}
		if time.Now().After(deadline) {
			_, dump, _ := nsGet(n.node.NS, "127.0.0.1:15000", "/debug/pprof/goroutine?debug=1")
			if len(dump) > 8000 {
				dump = dump[:8000]
			}
			t.Fatalf("after the pod's removal: fds %d→%d→%d, goroutines %v→%v→%v\n%s", fds0, fdsBusy, fds, g0, gBusy, g, dump)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if failed.Load() > 0 {
		t.Errorf("%d of %d cl→sv connections failed while bz was removed", failed.Load(), sent.Load())
	}
	kinds := map[string]int64{}
	ends.Range(func(k, v any) bool { kinds[k.(string)] = v.(*atomic.Int64).Load(); return true })
	t.Logf("fault pod-removed-mid-stream: conns=%d ended=%d %v slowest=%v (grace %v) del_acked_in=%v fds %d→%d→%d goroutines %v→%v→%v steady_conns=%d failed=%d",
		conns, ended.Load(), kinds, time.Duration(slowest.Load()).Round(time.Millisecond), grace, ackIn.Round(time.Millisecond),
		fds0, fdsBusy, fds, g0, gBusy, g, sent.Load(), failed.Load())
}
