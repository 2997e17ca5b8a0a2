package main

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/sockopt"
)

// TestInboundKeepsClientAddress: in in-pod mode the app sees the client
// pod's address as the source of an HBONE-delivered connection (upstream's
// original-source delivery), not its own address.
func TestInboundKeepsClientAddress(t *testing.T) {
	n := newInpodNode(t, "zos")
	ln, err := n.sv.Listen("tcp", netip.AddrPortFrom(n.sv.IP, 7200).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().String()))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.cl.Dial(ctx, "tcp", netip.AddrPortFrom(n.sv.IP, 7200).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != n.cl.IP.String() {
		t.Fatalf("server saw the connection from %q, want the client pod %s\n%s", b, n.cl.IP, readFile(n.logPath))
	}
	if got := metricSum(scrape(t, n.node.NS), "istio_tcp_connections_opened_total", `reporter="destination"`, `connection_security_policy="mutual_tls"`); got != 1 {
		t.Fatalf("destination counted %v mTLS connections, want 1", got)
	}

	// Plaintext from outside the mesh (marked, so the client pod's capture
	// lets it out) arrives on the server pod's 15006: the same holds.
	var pc net.Conn
	if err := n.cl.Do(func() (err error) {
		d := net.Dialer{Control: sockopt.Mark(0x539)}
		pc, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(n.sv.IP, 7200).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if b, err := io.ReadAll(pc); err != nil || string(b) != n.cl.IP.String() {
		t.Fatalf("plaintext: server saw %q (%v), want %s", b, err, n.cl.IP)
	}
	if got := metricSum(scrape(t, n.node.NS), "istio_tcp_connections_opened_total", `reporter="destination"`, `connection_security_policy="unknown"`); got != 1 {
		t.Fatalf("destination counted %v plaintext connections, want 1", got)
	}
}
