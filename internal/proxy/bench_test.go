package proxy_test

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkRequestResponse: 1 KiB request and response over one reused
// connection, client pod → ztunnel → HBONE → ztunnel → server pod, both
// proxies in this process (so ns/op is the CPU of the whole path).
func BenchmarkRequestResponse(b *testing.B) {
	m := newMesh(b, 100)
	echoServer(b, m.server)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 1024)
	buf := make([]byte, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewConnection: connect, 1 byte round trip, close, through a warm
// pool (one CONNECT stream per iteration on a shared HBONE connection).
func BenchmarkNewConnection(b *testing.B) {
	m := newMesh(b, 100)
	echoServer(b, m.server)
	dst := netip.AddrPortFrom(m.server.IP, 7000).String()
	one := []byte{1}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := m.client.Dial(ctx, "tcp", dst)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		c.Write(one)
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
