package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func procCount(t *testing.T, pid int, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/%s", pid, dir))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestPodChurnWhileTrafficFlows: 100 pods are added and removed one after
// another while a client keeps making connections to another pod; none of
// those connections fails, and afterwards the ztunnel process has the fds,
// threads and goroutines it had before (small slack for runtime threads).
func TestPodChurnWhileTrafficFlows(t *testing.T) {
	n := newInpodNode(t, "zch", "STATS_ADDR=127.0.0.1:15020")
	pid := n.cmd.Process.Pid
	dst := netip.AddrPortFrom(n.sv.IP, 7100).String()
	once := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := n.cl.Dial(ctx, "tcp", dst)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("ping"))
		c.(*net.TCPConn).CloseWrite()
		b := make([]byte, 128)
		k, err := c.Read(b)
		if err != nil || !strings.HasPrefix(string(b[:k]), "4 ") {
			return fmt.Errorf("reply %q: %v", b[:k], err)
		}
		return nil
	}
	if err := once(); err != nil {
		t.Fatal(err)
	}
	goroutines := func() float64 { return metricValue(scrape(t, n.node.NS), "go_goroutines") }
	time.Sleep(200 * time.Millisecond)
	fds0, threads0, g0 := procCount(t, pid, "fd"), procCount(t, pid, "task"), goroutines()

	stop := make(chan struct{})
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := once(); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
			sent.Add(1)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for i := 0; i < 100; i++ {
		p, err := n.node.AddPod(fmt.Sprintf("ch%d", i))
		if err != nil {
			t.Fatal(err)
		}
		uid := fmt.Sprintf("uid-ch%d", i)
		if err := n.enroll(ctx, p, uid, fmt.Sprintf("ch%d", i), "churn"); err != nil {
			t.Fatalf("add pod %d: %v", i, err)
		}
		if err := n.cni.RemovePod(ctx, uid); err != nil {
			t.Fatalf("remove pod %d: %v", i, err)
		}
		n.cluster.RemovePod(p)
	}
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d connections to a steady pod failed during churn; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
	if sent.Load() < 10 {
		t.Fatalf("only %d connections made during churn", sent.Load())
	}
	var fds, threads int
	var g float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		fds, threads, g = procCount(t, pid, "fd"), procCount(t, pid, "task"), goroutines()
		if fds <= fds0 && threads <= threads0+4 && g <= g0+2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 100 pods: fds %d→%d, threads %d→%d, goroutines %v→%v", fds0, fds, threads0, threads, g0, g)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d connections during churn; fds %d→%d, threads %d→%d, goroutines %v→%v", sent.Load(), fds0, fds, threads0, threads, g0, g)
}

// metricValue reads an unlabelled sample.
func metricValue(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+" ") {
			var v float64
			fmt.Sscan(strings.TrimPrefix(line, name+" "), &v)
			return v
		}
	}
	return -1
}
