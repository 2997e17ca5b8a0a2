package proxy

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// onlyConn hides *net.TCPConn so the buffered path is exercised.
type onlyConn struct{ *net.TCPConn }

func (c onlyConn) CloseWrite() error { return c.TCPConn.CloseWrite() }

func TestPipe(t *testing.T) {
	cases := []struct {
		name string
		wrap func(*net.TCPConn) net.Conn
	}{
		{"splice tcp to tcp", func(c *net.TCPConn) net.Conn { return c }},
		{"buffered", func(c *net.TCPConn) net.Conn { return onlyConn{c} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// app client <-> [down  proxy  up] <-> app server
			appClient, down := tcpPair(t)
			up, appServer := tcpPair(t)
			var cnt counters
			errc := make(chan error, 1)
			go func() { errc <- pipe(tc.wrap(down), tc.wrap(up), &cnt) }()

			req := make([]byte, 3<<20)
			rand.Read(req)
			resp := []byte("response after half-close")
			go func() {
				appClient.Write(req)
				appClient.CloseWrite() // half-close: server must see EOF
			}()
			got, err := io.ReadAll(appServer)
			if err != nil || !bytes.Equal(got, req) {
				t.Fatalf("server read %d bytes (err %v), want %d identical", len(got), err, len(req))
			}
			// The reverse direction still works after the client's FIN.
			appServer.Write(resp)
			appServer.CloseWrite()
			back, err := io.ReadAll(appClient)
			if err != nil || !bytes.Equal(back, resp) {
				t.Fatalf("client read %q (err %v)", back, err)
			}
			select {
			case err := <-errc:
				if err != nil {
					t.Fatalf("pipe: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("pipe did not finish after both half-closes")
			}
			if cnt.received.Load() != int64(len(req)) || cnt.sent.Load() != int64(len(resp)) {
				t.Fatalf("counts received=%d sent=%d, want %d/%d", cnt.received.Load(), cnt.sent.Load(), len(req), len(resp))
			}
		})
	}
}

func TestPipeResetPropagates(t *testing.T) {
	appClient, down := tcpPair(t)
	up, appServer := tcpPair(t)
	var cnt counters
	errc := make(chan error, 1)
	go func() { errc <- pipe(onlyConn{down}, onlyConn{up}, &cnt) }()
	appClient.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(appServer, buf); err != nil {
		t.Fatal(err)
	}
	appServer.SetLinger(0)
	appServer.Close() // RST towards the proxy
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("pipe returned nil after upstream reset")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pipe did not end after upstream reset")
	}
	appClient.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := appClient.Read(buf)
	if err == nil || err == io.EOF {
		t.Fatalf("client read err = %v, want a reset", err)
	}
}

// TestPipeClientResetWithSilentServer: the client resets while the server
// says nothing; the direction blocked reading the server must end too, so
// the handler and both sockets are released (spliced and buffered copies).
func TestPipeClientResetWithSilentServer(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(*net.TCPConn) net.Conn
	}{
		{"spliced", func(c *net.TCPConn) net.Conn { return c }},
		{"buffered", func(c *net.TCPConn) net.Conn { return onlyConn{c} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			appClient, down := tcpPair(t)
			up, appServer := tcpPair(t)
			defer appServer.Close()
			var cnt counters
			errc := make(chan error, 1)
			go func() { errc <- pipe(tc.wrap(down), tc.wrap(up), &cnt) }()
			appClient.Write([]byte("x"))
			buf := make([]byte, 1)
			if _, err := io.ReadFull(appServer, buf); err != nil {
				t.Fatal(err)
			}
			appClient.SetLinger(0)
			appClient.Close() // RST towards the proxy; the server stays silent
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("pipe returned nil after the client reset")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("pipe still running 5 s after the client reset, the server silent")
			}
		})
	}
}
