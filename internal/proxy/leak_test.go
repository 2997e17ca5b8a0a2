package proxy_test

import (
	"context"
	"io"
	"net/netip"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestE2ENoFDLeak: 200 proxied connections opened and closed leave the
// process with the file descriptors it had after the first one (the pooled
// HBONE connection and listeners stay).
func TestE2ENoFDLeak(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	dst := netip.AddrPortFrom(m.server.IP, 7000).String()
	roundTrip := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := m.client.Dial(ctx, "tcp", dst)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("x"))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	roundTrip()
	waitFor(t, func() bool { return m.clientZT.Connections() == 0 && m.serverZT.Connections() == 0 })
	// Pipes idle in splice's free list are held by no connection; how many
	// there are depends on how copies happened to overlap.
	proxy.DrainFreePipes()
	base := openFDs(t)
	for i := 0; i < 200; i++ {
		roundTrip()
	}
	waitFor(t, func() bool { return m.clientZT.Connections() == 0 && m.serverZT.Connections() == 0 })
	if n := m.hboneConns.Load(); n != 1 {
		t.Errorf("200 sequential connections used %d HBONE connections, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		proxy.DrainFreePipes()
		if openFDs(t) <= base {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d file descriptors open 10 s after the last connection closed, %d before: %v", openFDs(t), base, fdTargets(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fdTargets lists what this process's descriptors point at, for a failure
// message.
func fdTargets(t *testing.T) []string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			out = append(out, e.Name()+"→"+target)
		}
	}
	return out
}
