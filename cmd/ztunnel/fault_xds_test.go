package main

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/xds/xdstest"
)

// TestFaultXDSControlPlane: istiod is down when ztunnel starts, is cut off
// in the middle of a large push, and is replaced by a new istiod (new
// versions and nonces, different resources).
//   - down at start: ztunnel keeps running and retrying; readiness is 503
//     and names config with the connection error; once istiod is up, config
//     arrives and the condition clears.
//   - cut mid-push: the connection dies partway through a 300-workload
//     response; ztunnel never applies part of it (config_dump shows the old
//     or the new state only) and has the whole push after reconnecting.
//   - new istiod: ztunnel converges to the new server's state, dropping what
//     it no longer has.
func TestFaultXDSControlPlane(t *testing.T) {
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := hold.Addr().String()
	hold.Close() // nothing listens here until the proxy starts
	start := time.Now()
	p := startZtunnel(t, "XDS_ADDRESS=http://"+addr, "FAKE_CA=true", "PROXY_MODE=shared")
	readyURL := "http://" + p.addrs["readiness"] + "/healthz/ready"
	var body []byte
	eventually(t, "readiness to name the xDS error", func() bool {
		_, body = get(t, readyURL)
		return strings.Contains(string(body), "config (xds ConnectionError") && strings.Contains(string(body), "connection refused")
	})
	reasonAfter := time.Since(start)
	time.Sleep(2 * time.Second)
	select {
	case err := <-p.done:
		t.Fatalf("ztunnel exited while istiod was down: %v", err)
	default:
	}
	code, body := get(t, readyURL)
	if code != 503 || !strings.Contains(string(body), "config (") {
		t.Fatalf("readiness with istiod down = %d %q, want 503 naming config", code, body)
	}
	attempts := metricSum(scrapeHTTP(t, p), "istio_xds_connection_terminations_total")
	if attempts < 2 {
		t.Errorf("%v connection attempts while istiod was down, want retries", attempts)
	}

	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.SetAddress("c//Pod/ns/base", testWorkload("c//Pod/ns/base", "base", 1))
	px := startCutProxy(t, addr, srv.Addr())
	upAt := time.Now()
	eventually(t, "config after istiod came up", func() bool {
		_, body := get(t, readyURL)
		return !strings.Contains(string(body), "config")
	})
	configAfter := time.Since(upAt)
	if w, _ := dumpUIDs(t, p.addrs["admin"]); len(w) != 1 {
		t.Fatalf("workloads after first push = %v", w)
	}

	// Cut the stream 16 KiB into a ~40 KiB response.
	const bulk = 300
	px.cutAfter(16 << 10)
	set := map[string]proto.Message{}
	for i := range bulk {
		uid := fmt.Sprintf("c//Pod/ns/w%03d", i)
		set[uid] = testWorkload(uid, fmt.Sprintf("w%03d", i), byte(i%250+2))
	}
	srv.Push(addressType, set, nil) // one response
	seen := map[int]int{}
	deadline := time.Now().Add(20 * time.Second)
	for {
		w, _ := dumpUIDs(t, p.addrs["admin"])
		seen[len(w)]++
		if len(w) == bulk+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the cut: %d workloads, want %d; sizes seen %v", len(w), bulk+1, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for n := range seen {
		if n != 1 && n != bulk+1 {
			t.Errorf("config_dump showed %d workloads: part of a cut push was applied (sizes seen %v)", n, seen)
		}
	}
	if px.cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d streams, want 1", px.cuts.Load())
	}
	terminations := metricSum(scrapeHTTP(t, p), "istio_xds_connection_terminations_total") - attempts

	// A new istiod: fresh versions and nonces, half of the workloads gone,
	// one new.
	srv.Stop()
	srv2 := xdstest.NewServer(t, xdstest.Options{})
	for i := 0; i < bulk; i += 2 {
		uid := fmt.Sprintf("c//Pod/ns/w%03d", i)
		srv2.SetAddress(uid, testWorkload(uid, fmt.Sprintf("w%03d", i), byte(i%250+2)))
	}
	srv2.SetAddress("c//Pod/ns/new", testWorkload("c//Pod/ns/new", "new", 254))
	px.retarget(srv2.Addr())
	swapAt := time.Now()
	eventually(t, "convergence on the new istiod", func() bool {
		w, _ := dumpUIDs(t, p.addrs["admin"])
		return len(w) == bulk/2+1 && contains(w, "c//Pod/ns/new") && !contains(w, "c//Pod/ns/base")
	})
	converge := time.Since(swapAt)
	if code, body := get(t, readyURL); strings.Contains(string(body), "config") {
		t.Errorf("readiness after reconnects = %d %q: config must stay ready", code, body)
	}
	t.Logf("fault xds-down-at-start: reason_in_readiness_after=%v attempts_while_down=%v config_ready_after_up=%v",
		reasonAfter.Round(time.Millisecond), attempts, configAfter.Round(time.Millisecond))
	t.Logf("fault xds-cut-mid-push: push=%d workloads, cut_after=%d bytes, dump_sizes_seen=%v, partial_applies=0, stream_ends=%v",
		bulk, px.cutBytes.Load(), seen, terminations)
	t.Logf("fault xds-new-istiod: converged_to=%d workloads in %v", bulk/2+1, converge.Round(time.Millisecond))
}

func contains(l []string, v string) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
}

// scrapeHTTP reads the stats endpoint of a process started by startZtunnel.
func scrapeHTTP(t *testing.T, p *process) string {
	_, b := get(t, "http://"+p.addrs["stats"]+"/metrics")
	return string(b)
}

// cutProxy forwards TCP from listen to a target that can change; armed by
// cutAfter, it kills the next server→client stream after n bytes, once.
type cutProxy struct {
	ln       net.Listener
	cuts     atomic.Int64
	cutBytes atomic.Int64

	mu     sync.Mutex
	target string
	arm    int64 // bytes to let through before cutting; 0: not armed
	conns  []net.Conn
}

func startCutProxy(t *testing.T, listen, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	px := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); px.dropAll() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go px.serve(c)
		}
	}()
	return px
}

func (px *cutProxy) cutAfter(n int64) { px.mu.Lock(); px.arm = n; px.mu.Unlock() }

// retarget sends new connections to target and drops the current ones.
func (px *cutProxy) retarget(target string) {
	px.mu.Lock()
	px.target = target
	px.mu.Unlock()
	px.dropAll()
}

func (px *cutProxy) dropAll() {
	px.mu.Lock()
	conns := px.conns
	px.conns = nil
	px.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (px *cutProxy) serve(c net.Conn) {
	px.mu.Lock()
	target := px.target
	px.mu.Unlock()
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	px.mu.Lock()
	px.conns = append(px.conns, c, up)
	px.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	defer c.Close()
	defer up.Close()
	buf := make([]byte, 4096)
	var sent int64
	for {
		n, err := up.Read(buf)
		if n > 0 {
			px.mu.Lock()
			arm := px.arm
			if arm > 0 && sent+int64(n) >= arm {
				px.arm = 0
				px.mu.Unlock()
				k := arm - sent
				c.Write(buf[:k])
				px.cutBytes.Store(sent + k)
				px.cuts.Add(1)
				if tc, ok := c.(*net.TCPConn); ok {
					tc.SetLinger(0) // RST, as a killed istiod's kernel would
				}
				return
			}
			px.mu.Unlock()
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
			sent += int64(n)
		}
		if err != nil {
			return
		}
	}
}
