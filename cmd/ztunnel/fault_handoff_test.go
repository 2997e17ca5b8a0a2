package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/demo"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// TestFaultRestartHandoff is a DaemonSet rolling update on one node, in-pod
// mode: a second ztunnel process starts on the same node and ZDS socket,
// gets the agent's snapshot and opens its own SO_REUSEPORT listeners in
// every pod next to the old ones; then the old one gets SIGTERM, closes its
// listeners and drains. Both share one plug-in CA (as two ztunnels of one
// cluster share istiod's root).
//   - A client opens short connections cl→sv back to back through the whole
//     switch: none may fail.
//   - Long-lived connections opened on the old process: the ones that finish
//     inside the grace period arrive byte-exact; the ones that outlive it keep
//     flowing until the deadline and then end.
//   - The old process exits 0 within the grace period.
func TestFaultRestartHandoff(t *testing.T) {
	const grace = 6 // TERMINATION_GRACE_PERIOD_SECONDS → 5 s drain deadline
	n := newInpodNodeWith(t, "zho", func(*nstest.Node) []string {
		dir := t.TempDir()
		if err := demo.WritePluginCA(dir); err != nil {
			t.Fatal(err)
		}
		return []string{"LOCAL_CA_DIR=" + dir}
	}, fmt.Sprintf("TERMINATION_GRACE_PERIOD_SECONDS=%d", grace))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(n.sv.IP, 7100).String()
	if err := n.sinkOnce("warm"); err != nil {
		t.Fatal(err)
	}

	sigCh := make(chan struct{})
	var sigAtNanos atomic.Int64
	sigTime := func() time.Time { return time.Unix(0, sigAtNanos.Load()) }

	// Long-lived connections on the old process.
	const finishing, outliving = 8, 8
	type longConn struct {
		c       net.Conn
		sum     [32]byte
		written atomic.Int64
		lastOK  atomic.Int64 // unix nanos of the last successful write
		result  chan error
	}
	var longs []*longConn
	for i := range finishing + outliving {
		c, err := n.cl.Dial(ctx, "tcp", dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		lc := &longConn{c: c, result: make(chan error, 1)}
		longs = append(longs, lc)
		// The first group stops writing 2 s after SIGTERM, inside the
		// grace; the second writes for 30 s, beyond it.
		more := func() bool {
			select {
			case <-sigCh:
				return i >= finishing || time.Since(sigTime()) < 2*time.Second
			default:
				return true
			}
		}
		go func() {
			h := sha256.New()
			chunk := make([]byte, 4096)
			for more() {
				for j := range chunk {
					chunk[j] = byte(j + int(lc.written.Load()))
				}
				if _, err := c.Write(chunk); err != nil {
					lc.result <- err
					return
				}
				h.Write(chunk)
				lc.written.Add(int64(len(chunk)))
				lc.lastOK.Store(time.Now().UnixNano())
				time.Sleep(20 * time.Millisecond)
			}
			copy(lc.sum[:], h.Sum(nil))
			c.(*net.TCPConn).CloseWrite()
			reply, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				lc.result <- fmt.Errorf("no reply: %w", err)
				return
			}
			if want := fmt.Sprintf("%d %s\n", lc.written.Load(), hex.EncodeToString(lc.sum[:])); reply != want {
				lc.result <- fmt.Errorf("sink got %q, want %q", reply, want)
				return
			}
			lc.result <- nil
		}()
	}

	// Short connections back to back during the whole switch.
	var attempted, failed atomic.Int64
	var firstErr atomic.Value
	stopShort := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stopShort:
					return
				default:
				}
				attempted.Add(1)
				if err := n.sinkOnce("short"); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}

	// The new process: same environment, its own admin ports.
	newLog := filepath.Join(t.TempDir(), "ztunnel-new.log")
	lf, _ := os.Create(newLog)
	defer lf.Close()
	second := exec.Command(binary)
	second.Env = append(append([]string(nil), n.cmd.Env...), "ADMIN_ADDR=127.0.0.1:0", "STATS_ADDR=127.0.0.1:15120", "READINESS_ADDR=127.0.0.1:15121")
	second.Stdout, second.Stderr = lf, lf
	if err := n.node.Do(second.Start); err != nil {
		t.Fatal(err)
	}
	secondDone := make(chan error, 1)
	go func() { secondDone <- second.Wait() }()
	t.Cleanup(func() { second.Process.Kill() })
	if err := n.cni.WaitSnapshots(ctx, 2); err != nil {
		t.Fatalf("new ztunnel got no snapshot: %v\n%s", err, readFile(newLog))
	}
	eventually(t, "new ztunnel ready", func() bool {
		code, _, err := nsGet(n.node.NS, "127.0.0.1:15121", "/healthz/ready")
		return err == nil && code == 200
	})
	time.Sleep(500 * time.Millisecond) // both serve side by side
	sigAt := time.Now()
	sigAtNanos.Store(sigAt.UnixNano())
	close(sigCh)
	n.cmd.Process.Signal(syscall.SIGTERM)

	var oldExit error
	select {
	case oldExit = <-n.exited:
	case <-time.After(grace*time.Second + 5*time.Second):
		t.Fatalf("old ztunnel still running %v after SIGTERM\n%s", time.Since(sigAt), readFile(n.logPath))
	}
	oldGone := time.Since(sigAt)
	time.Sleep(time.Second) // new connections after the old one is gone
	close(stopShort)
	wg.Wait()

	var completed, ended int
	endings := map[string]int{}
	var lastFlow time.Duration
	for i, lc := range longs {
		var err error
		select {
		case err = <-lc.result:
		case <-time.After(10 * time.Second):
			t.Fatalf("long connection %d neither finished nor ended", i)
		}
		if i < finishing {
			if err != nil {
				t.Errorf("long connection %d (finishes inside the grace) failed: %v", i, err)
			} else {
				completed++
			}
			continue
		}
		if err == nil {
			t.Errorf("long connection %d outlived the grace period and still completed", i)
			continue
		}
		ended++
		endings[endKind(err)]++
		if d := time.Unix(0, lc.lastOK.Load()).Sub(sigAt); d > lastFlow {
			lastFlow = d
		}
		if d := time.Unix(0, lc.lastOK.Load()).Sub(sigAt); d < (grace-2)*time.Second {
			t.Errorf("long connection %d stopped flowing %v after SIGTERM, before the deadline: %v", i, d, err)
		}
	}
	if oldExit != nil {
		t.Errorf("old ztunnel exit: %v", oldExit)
	}
	if f := failed.Load(); f > 0 {
		first, _ := firstErr.Load().(string)
		t.Errorf("%d of %d new connections failed during the handoff; first: %v\nold: %s\nnew: %s", f, attempted.Load(), first,
			linesAbout(readFile(n.logPath), first), linesAbout(readFile(newLog), first))
	}
	select {
	case err := <-secondDone:
		t.Fatalf("new ztunnel exited: %v\n%s", err, readFile(newLog))
	default:
	}
	if err := n.sinkOnce("after"); err != nil {
		t.Errorf("new ztunnel alone: %v", err)
	}
	t.Logf("fault restart-handoff: new_conns=%d failed=%d long_finished_in_grace=%d/%d long_outliving=%d ended %v, last_flow=%v after SIGTERM, old_exit=%v after SIGTERM (grace %ds)",
		attempted.Load(), failed.Load(), completed, finishing, ended, endings, lastFlow.Round(time.Millisecond), oldGone.Round(time.Millisecond), grace)
}

// linesAbout keeps the log lines naming the client address in err
// ("read tcp A->B: ..."), or the warnings and errors if there is none.
func linesAbout(log, err string) string {
	key := "level=WARN"
	if i := strings.Index(err, "tcp "); i >= 0 {
		if j := strings.Index(err[i+4:], "->"); j > 0 {
			key = "src.addr=" + err[i+4:i+4+j] + " "
		}
	}
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, key) || strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// endKind classifies how a connection ended: "reset" (RST), "eof"
// (the peer's FIN), or the error text.
func endKind(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return err.Error()
}
