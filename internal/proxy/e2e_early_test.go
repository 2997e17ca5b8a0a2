package proxy_test

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// A server-first protocol (SMTP, MySQL, SSH) works through the tunnel:
// the client sends nothing until the server's greeting arrived, so the
// CONNECT goes without early bytes and the client's later ones follow it
// as usual; a client-first one (HTTP) has its first bytes sent with the
// CONNECT. Both reporters count every byte once, either way.
func TestE2EServerFirstAndClientFirst(t *testing.T) {
	m := newMesh(t, 100)
	echoServer(t, m.server)
	ln, err := m.server.Listen("tcp", netip.AddrPortFrom(m.server.IP, 7025).String())
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn) {
		c.Write([]byte("220 ready\r\n"))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil {
			c.Write([]byte("221 bye " + line))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7025).String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	if g, err := r.ReadString('\n'); err != nil || g != "220 ready\r\n" {
		t.Fatalf("greeting %q, %v", g, err)
	}
	c.Write([]byte("QUIT\r\n"))
	if g, err := r.ReadString('\n'); err != nil || g != "221 bye QUIT\r\n" {
		t.Fatalf("reply %q, %v", g, err)
	}
	c.Close()

	// Client first: the request is written before the proxy can have
	// opened the tunnel.
	e, err := m.client.Dial(ctx, "tcp", netip.AddrPortFrom(m.server.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	e.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET / HTTP/1.1\r\nHost: server\r\n\r\n"
	e.Write([]byte(req))
	e.(*net.TCPConn).CloseWrite()
	got := make([]byte, 0, len(req))
	buf := make([]byte, 256)
	for {
		n, err := e.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	if string(got) != req {
		t.Fatalf("echo %q, want %q", got, req)
	}
	e.Close()

	waitFor(t, func() bool { return m.clientZT.Connections() == 0 && m.serverZT.Connections() == 0 })
	wantUp := float64(len("QUIT\r\n") + len(req))
	wantDown := float64(len("220 ready\r\n221 bye QUIT\r\n") + len(req))
	for _, reporter := range []string{"source", "destination"} {
		if got := sumCounter(t, m.reg, "istio_tcp_received_bytes_total", "reporter", reporter); got != wantUp {
			t.Errorf("istio_tcp_received_bytes_total{reporter=%s} = %v, want %v", reporter, got, wantUp)
		}
		if got := sumCounter(t, m.reg, "istio_tcp_sent_bytes_total", "reporter", reporter); got != wantDown {
			t.Errorf("istio_tcp_sent_bytes_total{reporter=%s} = %v, want %v", reporter, got, wantDown)
		}
	}
}
