package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/proxy"
)

// TestE2EQuietConnectionRests: a proxied connection left quiet moves each
// socket → stream copy (outbound: client's socket; inbound: the server
// pod's) to a fresh goroutine, and goes on working across the pauses,
// counted once in the metrics, until it closes.
func TestE2EQuietConnectionRests(t *testing.T) {
	const rest = 50 * time.Millisecond
	defer proxy.SetRestAfter(proxy.SetRestAfter(rest))
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string) {
		t.Helper()
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Fatalf("echo of %q: %q, %v", msg, got, err)
		}
	}
	r0 := proxy.Rests()
	for i := range 3 {
		echo(fmt.Sprint("round ", i))
		// Both sides' copies pause once the socket has been quiet a rest
		// period (at most two).
		deadline := time.Now().Add(5 * time.Second)
		for proxy.Rests() < r0+2*int64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d copies paused, want %d", i, proxy.Rests()-r0, 2*(i+1))
			}
			time.Sleep(rest / 5)
		}
	}
	if n := m.clientZT.Connections(); n != 1 {
		t.Errorf("client ztunnel tracks %d connections across the pauses, want 1", n)
	}
	c.Close()
	waitFor(t, func() bool { return m.clientZT.Connections() == 0 && m.serverZT.Connections() == 0 })
	for _, reporter := range []string{"source", "destination"} {
		if o := sumCounter(t, m.reg, "istio_tcp_connections_closed_total", "reporter", reporter); o != 1 {
			t.Errorf("closed{reporter=%s} = %v, want 1", reporter, o)
		}
		if got := sumCounter(t, m.reg, "istio_tcp_received_bytes_total", "reporter", reporter); got != 21 {
			t.Errorf("received bytes{reporter=%s} = %v, want 21", reporter, got)
		}
	}
}
