package cniemu

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// TestDNSCaptureRules: with RedirectOptions.DNS, the pod's UDP and TCP
// traffic to any resolver's port 53 lands on 127.0.0.1:15053 in the pod
// (where ztunnel's DNS proxy listens), except ztunnel's own marked sockets,
// which reach the resolver (no capture loop).
func TestDNSCaptureRules(t *testing.T) {
	c := nstest.NewTestCluster(t, "cd")
	node, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	a, err := node.AddPod("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := node.AddPod("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := InstallRedirect(a.Path(), RedirectOptions{DNS: true}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	serveTag(t, &wg, a.NS, "127.0.0.1:15053", "proxy")
	resolver := netip.AddrPortFrom(b.IP, 53).String()
	serveTag(t, &wg, b.NS, resolver, "resolver")

	ztns, err := inpod.OpenNetns(a.Path(), inpod.NetnsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ztns.Close()
	for _, tc := range []struct {
		name, network string
		mark          uint32
		want          string
	}{
		{"app UDP", "udp", 0, "proxy"},
		{"app TCP", "tcp", 0, "proxy"},
		{"ztunnel's marked UDP", "udp", Mark, "resolver"},
		{"ztunnel's marked TCP", "tcp", Mark, "resolver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var conn net.Conn
			if tc.mark == 0 {
				conn, err = a.Dial(ctx, tc.network, resolver)
			} else {
				conn, err = ztns.Dial(ctx, tc.network, resolver, tc.mark)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := conn.Write([]byte("q")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, err := conn.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(buf[:n]); got != tc.want {
				t.Errorf("answered by %q, want %q", got, tc.want)
			}
		})
	}
}

// serveTag answers every UDP datagram and every TCP connection's first
// read on addr inside ns with tag.
func serveTag(t *testing.T, wg *sync.WaitGroup, ns *nstest.NS, addr, tag string) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	ln := listen(t, ns, addr)
	t.Cleanup(func() { pc.Close(); ln.Close() })
	wg.Go(func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(tag), from)
		}
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			c.Read(make([]byte, 64))
			c.Write([]byte(tag))
			c.Close()
		}
	})
}
