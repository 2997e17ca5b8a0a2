package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// relayTarget listens on loopback and serves what TestRelay and
// TestSealedRelayPair send through their relays: it echoes the first 1 KiB,
// then reads the rest of the stream and, once the client half-closes,
// answers with its length and SHA-256.
func relayTarget(t *testing.T) net.Listener {
	t.Helper()
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
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
				h := sha256.New()
				n, _ := io.Copy(h, c)
				binary.Write(c, binary.LittleEndian, n)
				c.Write(h.Sum(nil))
			}()
		}
	}()
	return srv
}

// exchangeThrough checks one connection through the relays at front
// against relayTarget: an echo, bulk data larger than the relay's buffer
// and the sockets' buffers (in odd-sized writes, so records and reads do
// not line up), the half-close passed on, the target's answer intact and
// its close passed back.
func exchangeThrough(t *testing.T, front string) {
	t.Helper()
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
	chunk := make([]byte, 1<<20-7)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	h := sha256.New()
	for sent := 0; sent < bulk; {
		p := chunk[:min(len(chunk), bulk-sent)]
		if _, err := c.Write(p); err != nil {
			t.Fatalf("bulk write after %d bytes: %v", sent, err)
		}
		h.Write(p)
		sent += len(p)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := binary.Read(c, binary.LittleEndian, &n); err != nil || n != bulk {
		t.Fatalf("server counted %d bytes (%v), want %d", n, err, bulk)
	}
	sum := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, sum); err != nil || !bytes.Equal(sum, h.Sum(nil)) {
		t.Fatalf("server's digest of the bulk data: %x (%v), want %x", sum, err, h.Sum(nil))
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the server closed: %v, want EOF", err)
	}
}

// inPlace runs f in the test's own namespace (startRelayWith's do).
func inPlace(f func() error) error { return f() }

// startTestRelay starts a relay process (this test binary, see TestMain)
// on loopback and stops it, checking it stops cleanly, when the test ends.
func startTestRelay(t *testing.T, pairs ...string) *relayProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := startRelayWith(ctx, "the test's namespace", inPlace, pairs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("relay did not stop cleanly when its stdin closed: %v (stderr %q)", err, r.log.String())
		}
	})
	return r
}

// TestRelay runs one relay in front of relayTarget: the exchange passes
// intact, and a target that refuses leaves the client with a closed
// connection, not a hang.
func TestRelay(t *testing.T) { inBothModes(t, testRelay) }

// inBothModes runs test against the epoll-loop relay and the goroutine
// one (relaygo.go).
func inBothModes(t *testing.T, test func(*testing.T)) {
	t.Run("epoll", test)
	t.Run(relayModeGoroutines, func(t *testing.T) {
		t.Setenv(relayModeEnv, relayModeGoroutines) // the relay processes inherit it
		test(t)
	})
}

func testRelay(t *testing.T) {
	srv := relayTarget(t)
	front, refusing, refused := freePort(t), freePort(t), freePort(t)
	startTestRelay(t, front+">"+srv.Addr().String(), refusing+">"+refused)
	exchangeThrough(t, front)

	d, err := net.Dial("tcp", refusing)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := d.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a relayed connection whose target refused: %v, want it closed", err)
	}
}

// TestSealedRelayPair runs sealed-relay-pair's two relays on loopback:
// the exchange passes intact through the sealed leg, and what crosses that
// leg is TLS 1.3-shaped records (type, version, at most 16 KiB of payload
// plus the tag) that open with the accepting end's keys, in sequence, to
// exactly what the client sent — no plaintext on the wire.
func TestSealedRelayPair(t *testing.T) { inBothModes(t, testSealedRelayPair) }

func testSealedRelayPair(t *testing.T) {
	srv := relayTarget(t)
	front, mid := freePort(t), freePort(t)
	startTestRelay(t, sealedPrefix+mid+">"+srv.Addr().String())
	startTestRelay(t, front+">"+sealedPrefix+mid)
	exchangeThrough(t, front)

	// A relay whose sealed leg ends at the test instead.
	tap, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	tapped := freePort(t)
	startTestRelay(t, tapped+">"+sealedPrefix+tap.Addr().String())
	c, err := net.Dial("tcp", tapped)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("plaintext!"), 5000) // 50 000 bytes: four records
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	wire, err := tap.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer wire.Close()
	wire.SetDeadline(time.Now().Add(10 * time.Second))
	s, err := newSealer(false)
	if err != nil {
		t.Fatal(err)
	}
	var raw, plain []byte
	buf := make([]byte, 64<<10)
	for len(plain) < len(msg) {
		n, err := wire.Read(buf)
		if err != nil {
			t.Fatalf("read the sealed leg after %d bytes of plaintext: %v", len(plain), err)
		}
		raw = append(raw, buf[:n]...)
		if bytes.Contains(raw, []byte("plaintext!")) {
			t.Fatal("plaintext on the sealed leg")
		}
		for len(raw) >= sealHeaderLen {
			m := int(raw[3])<<8 | int(raw[4])
			if raw[0] != 23 || raw[1] != 3 || raw[2] != 3 || m > sealRecordMax+sealTagLen {
				t.Fatalf("record header % x", raw[:sealHeaderLen])
			}
			if len(raw) < sealHeaderLen+m {
				break
			}
			p, rest, err := s.open(raw[:sealHeaderLen+m])
			if err != nil || len(rest) != 0 {
				t.Fatalf("open record %d: %v (%d bytes left)", s.r.seq, err, len(rest))
			}
			plain = append(plain, p...)
			raw = raw[sealHeaderLen+m:]
		}
	}
	if !bytes.Equal(plain, msg) {
		t.Fatalf("the sealed leg opened to %d bytes that differ from the %d sent", len(plain), len(msg))
	}
}

// TestSealerSplitAndTamper: records open whatever way the reads split
// them (an incomplete record is left for the next read), in order, and a
// changed bit, a wrong type or an oversized length is an error.
func TestSealerSplitAndTamper(t *testing.T) {
	msg := make([]byte, 3*sealRecordMax+100)
	for i := range msg {
		msg[i] = byte(i)
	}
	w, err := newSealer(true)
	if err != nil {
		t.Fatal(err)
	}
	wire := w.seal(nil, msg)
	if want := len(msg) + 4*sealOverhead; len(wire) != want || len(wire) > sealedSize(len(msg)) {
		t.Fatalf("sealed %d bytes into %d, want %d (at most %d)", len(msg), len(wire), want, sealedSize(len(msg)))
	}
	for _, step := range []int{1, 5, 4096, sealRecordMax + sealOverhead + 1, len(wire)} {
		r, _ := newSealer(false)
		var got, pending []byte
		for off := 0; off < len(wire); off += step {
			b := append(pending, wire[off:min(off+step, len(wire))]...)
			p, rest, err := r.open(b)
			if err != nil {
				t.Fatalf("step %d: open: %v", step, err)
			}
			got = append(got, p...)
			pending = append([]byte(nil), rest...)
		}
		if len(pending) != 0 || !bytes.Equal(got, msg) {
			t.Fatalf("step %d: opened %d bytes (%d pending), want the %d sealed", step, len(got), len(pending), len(msg))
		}
	}
	for name, change := range map[string]func(b []byte){
		"bit in the payload": func(b []byte) { b[100] ^= 1 },
		"bit in the tag":     func(b []byte) { b[sealHeaderLen+sealRecordMax+3] ^= 0x80 },
		"record type":        func(b []byte) { b[0] = 22 },
		"length":             func(b []byte) { b[3] = 0x50 },
		"header (its AAD)":   func(b []byte) { b[1] = 1 },
	} {
		b := append([]byte(nil), wire...)
		change(b)
		r, _ := newSealer(false)
		if _, _, err := r.open(b); !errors.Is(err, errBadRecord) {
			t.Errorf("%s changed: open gave %v, want errBadRecord", name, err)
		}
	}
	// The same records do not open with the dialler's own read key.
	r, _ := newSealer(true)
	if _, _, err := r.open(append([]byte(nil), wire...)); err == nil {
		t.Error("records opened with the key of the other direction")
	}
}

// TestRelayTargetMSS: a target with ",mss=N" is dialled with that
// TCP_MAXSEG, which caps what the target's side sends too (the relay's SYN
// announces it); without it the relay's sockets keep loopback's segments.
func TestRelayTargetMSS(t *testing.T) { inBothModes(t, testRelayTargetMSS) }

func testRelayTargetMSS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	capped, plain := freePort(t), freePort(t)
	startTestRelay(t, capped+">"+ln.Addr().String()+",mss=1460", plain+">"+ln.Addr().String())
	for _, tc := range []struct {
		front    string
		min, max int
	}{{capped, 1400, 1460}, {plain, 16 << 10, 1 << 16}} {
		c, err := net.Dial("tcp", tc.front)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
		s, err := ln.Accept()
		if err != nil {
			t.Fatalf("the relay at %s did not dial: %v", tc.front, err)
		}
		got, err := socketMSS(s)
		s.Close()
		if err != nil || got < tc.min || got > tc.max {
			t.Errorf("through %s: the target's socket has TCP_MAXSEG %d (%v), want %d..%d", tc.front, got, err, tc.min, tc.max)
		}
	}
}

// socketMSS is c's TCP_MAXSEG: the segment size it sends at.
func socketMSS(c net.Conn) (int, error) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var gerr error
	if err := rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
		return 0, err
	}
	return got, gerr
}

func TestRelayMainRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"127.0.0.1:1"}, {"nowhere>127.0.0.1:1"}, {"127.0.0.1:1>nowhere"},
		{"127.0.0.1:1>127.0.0.1:2,mss=x"}, {"127.0.0.1:1>127.0.0.1:2,mss=0"}} {
		if err := relayMain(args, os.Stdin, io.Discard); err == nil {
			t.Errorf("relayMain(%q) succeeded", args)
		}
	}
}

// TestDialerMSS: a path with mss dials sockets whose segments are capped
// (the kernel takes the timestamp option off TCP_MAXSEG), and one without
// keeps loopback's.
func TestDialerMSS(t *testing.T) {
	ln := relayTarget(t) // any listener: only the handshake matters
	for _, tc := range []struct {
		mss      int
		min, max int
	}{{1460, 1400, 1460}, {0, 16 << 10, 1 << 16}} {
		c, err := (&path{mss: tc.mss}).dialer().Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		got, gerr := socketMSS(c)
		c.Close()
		if gerr != nil || got < tc.min || got > tc.max {
			t.Errorf("mss %d: the connection's TCP_MAXSEG %d (%v), want %d..%d", tc.mss, got, gerr, tc.min, tc.max)
		}
	}
}
