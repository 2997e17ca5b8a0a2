package inpod

import (
	"context"
	"net"
	"testing"
)

// BenchmarkNetnsDial: one TCP connection dialed from inside a pod's
// namespace (to a listener there) and closed, as the inbound path dials
// its pod for every proxied connection.
func BenchmarkNetnsDial(b *testing.B) {
	ns := openPod(b, "inpod-dialbench", NetnsOptions{Mark: 0x539})
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
	ns := openPod(b, "inpod-dobench", NetnsOptions{})
	b.ReportAllocs()
	for range b.N {
		if err := ns.Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
