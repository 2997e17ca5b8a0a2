package hbone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestEcho64MiB(t *testing.T) {
	echo := startTCP(t, echoTCP)
	e := newEnv(t, dialHandler, envOpts{})
	ctx := testCtx(t)

	data := make([]byte, 64<<20)
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	rng.Read(data)

	s, err := e.pool.Connect(ctx, e.key, echo.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	werr := make(chan error, 1)
	go func() {
		// Odd chunk size so writes do not line up with frames or records.
		for off := 0; off < len(data); off += 100_003 {
			if _, err := s.Write(data[off:min(off+100_003, len(data))]); err != nil {
				werr <- err
				return
			}
		}
		werr <- s.CloseWrite()
	}()
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echo differs: got %d bytes, sent %d", len(got), len(data))
	}
	if n := e.ln.accepted.Load(); n != 1 {
		t.Errorf("accepted %d connections, want 1", n)
	}
}

func TestHalfClose(t *testing.T) {
	tests := []struct {
		name string
		// upstream is the TCP server behind the HBONE server.
		upstream func(c *net.TCPConn, seen chan<- string)
		// client drives the stream and returns what it read.
		client func(s *Stream) (string, error)
		want   string // client read
		seen   string // upstream read
	}{
		{
			name: "client closes write first, still reads the reply",
			upstream: func(c *net.TCPConn, seen chan<- string) {
				b, _ := io.ReadAll(c) // until the client's END_STREAM
				seen <- string(b)
				fmt.Fprintf(c, "got %d bytes", len(b))
				c.CloseWrite()
			},
			client: func(s *Stream) (string, error) {
				if _, err := s.Write([]byte("hello")); err != nil {
					return "", err
				}
				if err := s.CloseWrite(); err != nil {
					return "", err
				}
				b, err := io.ReadAll(s)
				return string(b), err
			},
			want: "got 5 bytes",
			seen: "hello",
		},
		{
			name: "upstream closes write first, client sees EOF and can still send",
			upstream: func(c *net.TCPConn, seen chan<- string) {
				c.Write([]byte("banner"))
				c.CloseWrite()
				b, _ := io.ReadAll(c) // until the client's END_STREAM
				seen <- string(b)
			},
			client: func(s *Stream) (string, error) {
				// Read to EOF without closing our side, then send: the
				// server side is half-closed, not finished.
				b, err := io.ReadAll(s)
				if err != nil {
					return "", err
				}
				if _, err := s.Write([]byte("after EOF")); err != nil {
					return "", err
				}
				return string(b), s.CloseWrite()
			},
			want: "banner",
			seen: "after EOF",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan string, 1)
			up := startTCP(t, func(c *net.TCPConn) { tc.upstream(c, seen) })
			e := newEnv(t, dialHandler, envOpts{})
			s, err := e.pool.Connect(testCtx(t), e.key, up.String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, err := tc.client(s)
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			if got != tc.want {
				t.Errorf("client read %q, want %q", got, tc.want)
			}
			if got := recvTimeout(t, seen, "upstream read"); got != tc.seen {
				t.Errorf("upstream read %q, want %q", got, tc.seen)
			}
		})
	}
}

func TestResetPropagation(t *testing.T) {
	t.Run("upstream reset reaches the client as an error", func(t *testing.T) {
		up := startTCP(t, func(c *net.TCPConn) {
			b := make([]byte, 1)
			io.ReadFull(c, b)
			c.SetLinger(0) // RST, not FIN
			c.Close()
		})
		e := newEnv(t, dialHandler, envOpts{})
		s, err := e.pool.Connect(testCtx(t), e.key, up.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(s)
		if err == nil {
			t.Fatal("read ended with clean EOF, want a reset error")
		}
	})
	t.Run("client reset reaches the upstream", func(t *testing.T) {
		ended := make(chan error, 1)
		up := startTCP(t, func(c *net.TCPConn) {
			b := make([]byte, 1)
			io.ReadFull(c, b)
			_, err := c.Read(b) // blocks until the proxy gives up
			ended <- err
		})
		e := newEnv(t, dialHandler, envOpts{})
		s, err := e.pool.Connect(testCtx(t), e.key, up.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := s.Reset(); err != nil {
			t.Fatal(err)
		}
		if err := recvTimeout(t, ended, "upstream read to end"); err == nil {
			t.Fatal("upstream read returned data, want EOF or reset")
		}
	})
	t.Run("close with unread data resets", func(t *testing.T) {
		handlerErr := make(chan error, 1)
		e := newEnv(t, func(ctx context.Context, req *Request) {
			st, err := req.Accept(nil)
			if err != nil {
				return
			}
			defer st.Close()
			st.Write([]byte("unread"))
			_, err = io.ReadAll(st)
			handlerErr <- err
		}, envOpts{})
		s, err := e.pool.Connect(testCtx(t), e.key, "127.0.0.1:9", nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Close() // no read, no CloseWrite
		if err := recvTimeout(t, handlerErr, "handler read"); err == nil {
			t.Fatal("server saw clean EOF, want a reset")
		}
	})
}

func TestStreamInfo(t *testing.T) {
	e := newEnv(t, func(ctx context.Context, req *Request) {
		if got := req.Header.Get(HeaderTraceparent); got == "" {
			req.Reject(400, "no_traceparent")
			return
		}
		if ids := req.PeerCertificates(); len(ids) == 0 || ids[0].URIs[0].String() != spiffeID("client", "cli") {
			req.Reject(403, "wrong_peer")
			return
		}
		st, err := req.Accept(map[string][]string{"Baggage": {FormatBaggage(Baggage{Namespace: "server"}, "deployment")}})
		if err != nil {
			return
		}
		st.Write([]byte(req.Authority.String() + " " + strconv.Itoa(int(req.LocalAddr.Port()))))
		st.Close()
	}, envOpts{})
	hdr := &ConnectHeader{Traceparent: NewTraceParent().String()}
	s, err := e.pool.Connect(testCtx(t), e.key, "10.1.2.3:8080", hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	want := "10.1.2.3:8080 " + strconv.Itoa(int(e.ln.addr().Port()))
	if string(b) != want {
		t.Errorf("read %q, want %q", b, want)
	}
	if bg, _ := ParseBaggage(s.Header().Values(HeaderBaggage)); bg.Namespace != "server" {
		t.Errorf("response baggage %+v, want namespace server", bg)
	}
	cs := s.ConnectionState()
	if cs.NegotiatedProtocol != "h2" || len(cs.PeerCertificates) == 0 || cs.PeerCertificates[0].URIs[0].String() != spiffeID("server", "srv") {
		t.Errorf("connection state: proto %q, peer certs %d", cs.NegotiatedProtocol, len(cs.PeerCertificates))
	}
	if s.RemoteAddr().String() != e.ln.Addr().String() {
		t.Errorf("RemoteAddr %v, want %v", s.RemoteAddr(), e.ln.Addr())
	}
	if err := s.SetDeadline(time.Time{}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("SetDeadline: %v, want ErrUnsupported", err)
	}
}

// TestSinkBoundsUnsent: a socket a stream delivers into gets
// TCP_NOTSENT_LOWAT once it has filled up behind a reader that does not
// keep up (so a slow reader's stream drains, and returns window, in small
// steps), and not before (a reader that keeps up pays no wake-ups for it,
// a short connection no syscall).
func TestSinkBoundsUnsent(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	s, err := e.pool.Connect(testCtx(t), e.key, "10.1.2.3:8080", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst, reader := tcpPair(t)
	copied := make(chan error, 1)
	go func() {
		_, err := s.WriteTo(dst)
		copied <- err
	}()
	lowat := func() int {
		rc, err := dst.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var serr error
		if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return v
	}
	written := make(chan error, 1)
	send := func(n int) { // echoed back by the server into dst
		go func() {
			_, err := s.Write(make([]byte, n))
			written <- err
		}()
	}
	send(64 << 10)
	if _, err := io.ReadFull(reader, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := recvTimeout(t, written, "the first write"); err != nil {
		t.Fatal(err)
	}
	if got := lowat(); got == notSentLowat {
		t.Errorf("TCP_NOTSENT_LOWAT = %d with nothing backed up", got)
	}
	// More than the socket's buffers (a few MiB on loopback) hold, with
	// the reader not reading.
	const bulk = 32 << 20
	send(bulk)
	waitFor(t, "TCP_NOTSENT_LOWAT on the full socket", func() bool { return lowat() == notSentLowat })
	if n, err := io.CopyN(io.Discard, reader, bulk); err != nil {
		t.Fatalf("read %d of %d bytes: %v", n, bulk, err)
	}
	if err := recvTimeout(t, written, "the bulk write"); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	if err := recvTimeout(t, copied, "WriteTo's end"); err != nil {
		t.Fatal(err)
	}
}

// TestStreamWindowUpdatePolicy: a stream whose reader keeps up (its
// sender has most of the window left) returns window in quarter-window
// updates; one whose reader fell behind, so that its sender is down to
// less than half the window, in streamUpdateEvery steps, so that sender
// never bursts more than that ahead of other streams — until the window
// has refilled.
func TestStreamWindowUpdatePolicy(t *testing.T) {
	const piece = 16 << 10
	// receive takes n bytes from the peer and consumes them: the updates
	// it returns are what the peer gets.
	receive := func(s *h2stream, n int) (incs []uint32) {
		s.rmu.Lock()
		defer s.rmu.Unlock()
		for range n / piece {
			s.recvWin -= piece
			if inc := s.streamCreditLocked(piece); inc > 0 {
				incs = append(incs, inc)
			}
		}
		return incs
	}
	all := func(incs []uint32, want uint32) bool {
		for _, inc := range incs {
			if inc != want {
				return false
			}
		}
		return len(incs) > 0
	}

	s := newH2Stream(nil, 1, 0)
	if incs := receive(s, 8*streamUpdateKeepingUp); len(incs) != 8 || !all(incs, streamUpdateKeepingUp) {
		t.Errorf("a reader that keeps up: updates %v, want 8 of %d KiB", incs, streamUpdateKeepingUp>>10)
	}

	// The reader stalls: 3 MiB arrive and wait unconsumed.
	s.rmu.Lock()
	s.recvWin -= 3 << 20
	s.rmu.Unlock()
	incs := receive(s, 1<<20)
	if !all(incs, streamUpdateEvery) {
		t.Errorf("a sender down to %d KiB of window: updates %v, want each %d KiB", (streamWindow-3<<20)>>10, incs, streamUpdateEvery>>10)
	}
	// Consumed at last, the 3 MiB refill the window in small steps, then
	// the updates grow again.
	s.rmu.Lock()
	var refill []uint32
	for range (3 << 20) / piece {
		if inc := s.streamCreditLocked(piece); inc > 0 {
			refill = append(refill, inc)
		}
	}
	s.rmu.Unlock()
	if len(refill) == 0 || refill[0] != streamUpdateEvery {
		t.Errorf("draining the backlog: updates %v, want %d KiB ones first", refill, streamUpdateEvery>>10)
	}
	if incs := receive(s, 4*streamUpdateKeepingUp); !all(incs[1:], streamUpdateKeepingUp) {
		t.Errorf("caught up again: updates %v, want %d KiB ones", incs, streamUpdateKeepingUp>>10)
	}

	if streamUpdateKeepingUp <= streamUpdateEvery || streamUpdateKeepingUp > streamWindow/2 {
		t.Errorf("streamUpdateKeepingUp %d: want above streamUpdateEvery (%d) and at most half the window (%d), or a keeping-up sender stalls", streamUpdateKeepingUp, streamUpdateEvery, streamWindow/2)
	}
}
