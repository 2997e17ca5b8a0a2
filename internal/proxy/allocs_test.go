package proxy_test

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"
)

// maxAllocsPerRoundTrip: a 1 KiB request and its echo through both
// proxies (client pod → ztunnel → HBONE → ztunnel → server pod) allocate
// nothing in this project's code. crypto/tls allocates one small object
// per TLS record it reads (its atLeastReader escapes into
// bytes.Buffer.ReadFrom), and a round trip reads two records: the
// request at the server's ztunnel, the response at the client's.
const maxAllocsPerRoundTrip = 2

func TestRequestResponseAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates by itself: allocation counts are meaningless under -race")
	}
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 1024)
	buf := make([]byte, 1024)
	roundTrip := func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 { // warm up: pools, buffers, windows
		roundTrip()
	}
	got := testing.AllocsPerRun(500, roundTrip)
	t.Logf("%.2f allocations per 1 KiB round trip through both proxies (test's echo server included)", got)
	if got > maxAllocsPerRoundTrip {
		t.Errorf("%.2f allocations per round trip, want ≤ %d", got, maxAllocsPerRoundTrip)
	}
}
