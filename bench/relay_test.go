package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRelay runs the relay process (this test binary, see TestMain) on
// loopback in front of a server that echoes the first 1 KiB and then
// counts the rest of the stream and answers with the count once the
// client half-closes: both directions, bulk data larger than the relay's
// buffer and the sockets' buffers, the half-close passed on, and a target
// that refuses leaves the client with a closed connection, not a hang.
func TestRelay(t *testing.T) {
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				head := make([]byte, 1024)
				if _, err := io.ReadFull(c, head); err != nil {
					return
				}
				if _, err := c.Write(head); err != nil {
					return
				}
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.LittleEndian, n)
			}()
		}
	}()
	front, refused := freePort(t), freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inPlace := func(f func() error) error { return f() }
	r, err := startRelayWith(ctx, "the test's namespace", inPlace, []string{
		front + ">" + srv.Addr().String(),
		freePort(t) + ">" + refused,
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			r.stop()
		}
	}()

	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	req := bytes.Repeat([]byte("0123456789abcdef"), 64)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(req))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, req) {
		t.Fatalf("echo through the relay: %v, equal %v", err, bytes.Equal(got, req))
	}
	const bulk = 64 << 20
	chunk := make([]byte, 1<<20)
	for sent := 0; sent < bulk; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("bulk write after %d bytes: %v", sent, err)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := binary.Read(c, binary.LittleEndian, &n); err != nil || n != bulk {
		t.Fatalf("server counted %d bytes (%v), want %d", n, err, bulk)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the server closed: %v, want EOF", err)
	}

	// The second listener's target refuses: the relay closes the client.
	lnAddr := r.cmd.Args[3][:len(r.cmd.Args[3])-len(">"+refused)]
	d, err := net.Dial("tcp", lnAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := d.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a relayed connection whose target refused: %v, want it closed", err)
	}

	stopped = true
	if err := r.stop(); err != nil {
		t.Fatalf("relay did not stop cleanly when its stdin closed: %v (stderr %q)", err, r.log.String())
	}
}

func TestRelayMainRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"127.0.0.1:1"}, {"nowhere>127.0.0.1:1"}, {"127.0.0.1:1>nowhere"}} {
		if err := relayMain(args, os.Stdin, io.Discard); err == nil {
			t.Errorf("relayMain(%q) succeeded", args)
		}
	}
}
