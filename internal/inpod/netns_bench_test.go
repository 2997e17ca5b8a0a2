package inpod

import (
	"context"
	"net"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// BenchmarkNetnsDial: one TCP connection dialed from inside a pod's
// namespace (to a listener there) and closed, as the inbound path dials
// its pod for every proxied connection.
func BenchmarkNetnsDial(b *testing.B) {
	nstest.RequireRoot(b)
	pod := nstest.New(b, "inpod-dialbench")
	ns, err := OpenNetns(pod.Path(), NetnsOptions{Mark: 0x539})
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	ln, err := ns.Listen("tcp", "127.0.0.1:7000")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c, err := ns.Dial(ctx, "tcp", "127.0.0.1:7000", 0x539)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	_ = net.ErrClosed
}

// BenchmarkNetnsDo: entering and leaving a pod's namespace on a locked
// thread, with nothing done inside.
func BenchmarkNetnsDo(b *testing.B) {
	nstest.RequireRoot(b)
	pod := nstest.New(b, "inpod-dobench")
	ns, err := OpenNetns(pod.Path(), NetnsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	b.ReportAllocs()
	for range b.N {
		if err := ns.Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
