package identity_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// BenchmarkGet is the per-handshake certificate lookup of a cached identity.
func BenchmarkGet(b *testing.B) {
	m := newManager(b, identity.ManagerOptions{CA: newTestCA(b).ca})
	defer m.Close()
	ctx := context.Background()
	if _, err := m.Get(ctx, idA); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := m.Get(ctx, idA); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMutualHandshake is one full mTLS 1.3 handshake with the cached
// configs, over an in-memory pipe.
func BenchmarkMutualHandshake(b *testing.B) {
	m := newManager(b, identity.ManagerOptions{CA: newTestCA(b).ca})
	defer m.Close()
	srvCfg := m.ServerConfig(srvID)
	b.ReportAllocs()
	for b.Loop() {
		c1, c2 := net.Pipe()
		errc := make(chan error, 1)
		go func() {
			s := tls.Server(c2, srvCfg)
			errc <- s.Handshake()
		}()
		c := tls.Client(c1, m.ClientConfig(cliID, []identity.Identity{srvID}))
		if err := c.Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		// Close the pipe, not the TLS conns: close_notify over an unbuffered
		// pipe that nobody reads would wait out tls.Conn's 5 s write deadline.
		_ = c1.Close()
		_ = c2.Close()
	}
}
