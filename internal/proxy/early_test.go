package proxy

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// readReady takes what the client already sent and never waits; EOF
// stays for the copy to see, a reset is an error.
func TestReadReady(t *testing.T) {
	buf := make([]byte, 64)
	t.Run("nothing sent", func(t *testing.T) {
		c, s := tcpPair(t)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if n, err := readReady(s, buf); n != 0 || err != nil {
				t.Errorf("readReady = %d, %v; want 0, nil", n, err)
			}
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("readReady waited for a silent client")
		}
		// The poller still works for the copy that follows.
		go c.Write([]byte("later"))
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(io.LimitReader(s, 5)); err != nil || string(b) != "later" {
			t.Errorf("read after readReady: %q, %v", b, err)
		}
	})
	t.Run("bytes waiting", func(t *testing.T) {
		c, s := tcpPair(t)
		c.Write([]byte("GET / HTTP/1.1\r\n"))
		waitReadable(t, s)
		if n, err := readReady(s, buf); err != nil || string(buf[:n]) != "GET / HTTP/1.1\r\n" {
			t.Errorf("readReady = %q, %v; want the request line", buf[:n], err)
		}
	})
	t.Run("EOF", func(t *testing.T) {
		c, s := tcpPair(t)
		c.CloseWrite()
		waitReadable(t, s)
		if n, err := readReady(s, buf); n != 0 || err != nil {
			t.Errorf("readReady = %d, %v; want 0, nil", n, err)
		}
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := s.Read(buf); n != 0 || err != io.EOF {
			t.Errorf("read after readReady: %d, %v; want EOF again", n, err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		c, s := tcpPair(t)
		c.SetLinger(0)
		c.Close()
		waitReadable(t, s)
		if _, err := readReady(s, buf); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("readReady: %v, want ECONNRESET", err)
		}
	})
}

// waitReadable waits until s has something to read (bytes, EOF or an
// error) without reading it: poll(2), which leaves a pending error for
// the next read where a peek would take it.
func waitReadable(t *testing.T, s *net.TCPConn) {
	t.Helper()
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var perr error
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, perr = unix.Poll(fds, 5000)
	}); err != nil || perr != nil || n != 1 {
		t.Fatalf("poll: %d, %v, %v", n, err, perr)
	}
}
