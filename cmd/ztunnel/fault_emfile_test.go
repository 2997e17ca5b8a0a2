package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFaultAcceptEMFILE: ztunnel's fd limit is lowered (prlimit) to a few
// dozen above what it uses, and 200 clients connect and hold their
// connections. Accepts then fail with EMFILE: ztunnel counts them, backs off
// instead of spinning, keeps a transfer that was already running flowing
// byte-exact, and serves new connections again once the clients go away.
func TestFaultAcceptEMFILE(t *testing.T) {
	n := newInpodNode(t, "zem")
	pid := n.cmd.Process.Pid
	dst := netip.AddrPortFrom(n.sv.IP, 7100).String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.sinkOnce("warm"); err != nil {
		t.Fatal(err)
	}

	// A transfer that runs through the whole fault.
	long, err := n.cl.Dial(ctx, "tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	var written atomic.Int64
	stopLong := make(chan struct{})
	longDone := make(chan error, 1)
	go func() {
		h := sha256.New()
		chunk := make([]byte, 8192)
		for i := 0; ; i++ {
			select {
			case <-stopLong:
				long.(*net.TCPConn).CloseWrite()
				reply, err := bufio.NewReader(long).ReadString('\n')
				if want := fmt.Sprintf("%d %s\n", written.Load(), hex.EncodeToString(h.Sum(nil))); err != nil || reply != want {
					longDone <- fmt.Errorf("long transfer: reply %q (%v), want %q", reply, err, want)
					return
				}
				longDone <- nil
				return
			default:
			}
			for j := range chunk {
				chunk[j] = byte(i + j)
			}
			if _, err := long.Write(chunk); err != nil {
				longDone <- fmt.Errorf("long transfer write: %w", err)
				return
			}
			h.Write(chunk)
			written.Add(int64(len(chunk)))
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)

	fds0 := procCount(t, pid, "fd")
	limit := uint64(fds0 + 30)
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	// Only the soft limit: raising it back needs no privilege.
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: old.Max}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	const clients = 200
	var held []net.Conn
	for range clients {
		c, err := n.cl.Dial(ctx, "tcp", dst) // the kernel completes the handshake even when ztunnel cannot accept
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		held = append(held, c)
	}
	beforeBytes := written.Load()
	const window = 3 * time.Second
	time.Sleep(window)
	during := written.Load() - beforeBytes
	fdsFull := procCount(t, pid, "fd")
	for _, c := range held {
		c.Close()
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
		t.Fatal(err)
	}
	recoverAt := time.Now()
	eventually(t, "a new connection after the clients left", func() bool { return n.sinkOnce("after") == nil })
	recovered := time.Since(recoverAt)
	close(stopLong)
	if err := <-longDone; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-n.exited:
		t.Fatalf("ztunnel exited: %v", err)
	default:
	}
	text := scrape(t, n.node.NS)
	emfile := metricSum(text, "istio_ztunnel_accept_errors_total", `reason="emfile"`)
	if emfile < 1 {
		t.Errorf("istio_ztunnel_accept_errors_total{reason=emfile} = %v, want the failed accepts counted", emfile)
	}
	// Backoff: 5 ms doubling to 1 s, reset by each accept that succeeds
	// (fds freed by connections failing downstream), gives tens per second;
	// an accept loop without backoff fails hundreds of thousands of times.
	if perSec := emfile / window.Seconds(); perSec > 300 {
		t.Errorf("%v EMFILE accept failures in %v: the accept loop spins instead of backing off", emfile, window)
	}
	if during == 0 {
		t.Errorf("the running transfer stalled while accepts failed")
	}
	t.Logf("fault accept-emfile: fd_limit=%d (in use %d, at peak %d) clients=%d emfile_errors=%v in %v (backoff; by port: %s) running_transfer=%d bytes during, byte-exact; new conn ok %v after clients left",
		limit, fds0, fdsFull, clients, emfile, window, strings.ReplaceAll(grepLines(text, "istio_ztunnel_accept_errors_total"), "\n", "; "), during, recovered.Round(time.Millisecond))
}
