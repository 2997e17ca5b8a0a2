package hbone

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A CONNECT's early bytes leave in the same write as its HEADERS, as a
// DATA frame of the new stream that does not end it; when the windows
// cannot take them, the write carries the HEADERS alone and the caller
// gets them back to send.
func TestOpenStreamEarlyInOneWrite(t *testing.T) {
	for _, tc := range []struct {
		name     string
		early    []byte
		peerWin  int64
		wantSent bool
	}{
		{"fits", []byte("hello"), 65535, true},
		{"window short", []byte("hello"), 4, false},
		{"over a record", bytes.Repeat([]byte("x"), 16<<10+1), 1 << 20, false},
		{"none", nil, 65535, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newGateWire(true)
			c := newGateConn(w)
			c.mu.Lock()
			c.peerInitWin = tc.peerWin
			c.peerMaxFrame = 1 << 20
			connWin := c.sendWin
			c.mu.Unlock()
			type result struct {
				s    *h2stream
				sent bool
				err  error
			}
			done := make(chan result, 1)
			go func() {
				s, sent, err := c.openStream(connectFields("10.0.0.1:80", nil), tc.early)
				done <- result{s, sent, err}
			}()
			wr := w.next(t)
			w.release <- struct{}{}
			r := recvTimeout(t, done, "openStream")
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.sent != tc.wantSent {
				t.Errorf("sent = %v, want %v", r.sent, tc.wantSent)
			}
			fr := http2.NewFramer(nil, bytes.NewReader(wr.frames))
			fr.MaxHeaderListSize = 1 << 20
			fr.SetMaxReadFrameSize(1 << 24)
			f, err := fr.ReadFrame()
			if h, ok := f.(*http2.HeadersFrame); err != nil || !ok || h.StreamID != r.s.id || h.StreamEnded() {
				t.Fatalf("first frame %v (%v), want HEADERS of stream %d not ending it", f, err, r.s.id)
			}
			f, err = fr.ReadFrame()
			wantWin := tc.peerWin
			if tc.wantSent {
				d, ok := f.(*http2.DataFrame)
				if err != nil || !ok || d.StreamID != r.s.id || d.StreamEnded() || !bytes.Equal(d.Data(), tc.early) {
					t.Fatalf("second frame %v (%v), want DATA of stream %d with the early bytes", f, err, r.s.id)
				}
				_, err = fr.ReadFrame()
				wantWin -= int64(len(tc.early))
			}
			if err != io.EOF {
				t.Errorf("after the CONNECT's frames: %v, %v; want the write's end", f, err)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if r.s.sendWin != wantWin || c.sendWin != connWin-(tc.peerWin-wantWin) {
				t.Errorf("send windows: stream %d, connection %d; want %d, %d", r.s.sendWin, c.sendWin, wantWin, connWin-(tc.peerWin-wantWin))
			}
		})
	}
}

// The early bytes reach the server before it answers, and through our
// own server they reach the destination: the echo comes back with
// nothing else written.
func TestConnectEarlyBytes(t *testing.T) {
	t.Run("before the answer", func(t *testing.T) {
		e := newEnv(t, echoHandler, envOpts{})
		got := make(chan string, maxConnectAttempts)
		key := e.fakePeer(t, func(sc *tls.Conn) {
			defer sc.Close() // a failure here fails the Connect too
			fr := rawServer(sc, nil)
			_ = sc.SetReadDeadline(time.Now().Add(2 * time.Second))
			h, ok := nextStreamFrame(fr).(*http2.HeadersFrame)
			if !ok {
				got <- "no HEADERS"
				return
			}
			// Nothing is answered yet: the bytes must come anyway.
			d, ok := nextStreamFrame(fr).(*http2.DataFrame)
			if !ok {
				got <- "no DATA before the answer"
				return
			}
			got <- string(d.Data())
			respond(fr, h.StreamID, "200")
			_, _ = io.Copy(io.Discard, sc)
		})
		connectEarly(t, e, key, got)
	})
	t.Run("window short", func(t *testing.T) {
		// A peer whose streams start with a 2-byte window gets the
		// CONNECT alone, and the bytes after its 200 as the window
		// allows; Connect returns once they are all out.
		e := newEnv(t, echoHandler, envOpts{})
		got := make(chan string, maxConnectAttempts)
		key := e.fakePeer(t, func(sc *tls.Conn) {
			defer sc.Close()
			fr := rawServer(sc, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 2}})
			_ = sc.SetReadDeadline(time.Now().Add(2 * time.Second))
			h, ok := nextStreamFrame(fr).(*http2.HeadersFrame)
			if !ok {
				got <- "no HEADERS"
				return
			}
			respond(fr, h.StreamID, "200")
			var b []byte
			for len(b) < len("hello") {
				d, ok := nextStreamFrame(fr).(*http2.DataFrame)
				if !ok {
					got <- fmt.Sprintf("after %q: not DATA", b)
					return
				}
				b = append(b, d.Data()...)
				if len(b) == 2 {
					_ = fr.WriteWindowUpdate(h.StreamID, 100)
				}
			}
			got <- string(b)
			_, _ = io.Copy(io.Discard, sc)
		})
		connectEarly(t, e, key, got)
	})
	t.Run("echoed by our server", func(t *testing.T) {
		e := newEnv(t, echoHandler, envOpts{})
		s, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", &ConnectHeader{Early: []byte("hello")})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Write([]byte(", world")); err != nil {
			t.Fatal(err)
		}
		_ = s.CloseWrite()
		if b, err := io.ReadAll(s); err != nil || string(b) != "hello, world" {
			t.Errorf("echo %q, %v; want the early bytes, then the written ones", b, err)
		}
	})
}

// connectEarly connects to key with early bytes "hello" and checks that
// the server reported reading them (on got).
func connectEarly(t *testing.T, e *testEnv, key Key, got <-chan string) {
	t.Helper()
	s, err := e.pool.Connect(testCtx(t), key, "10.0.0.1:80", &ConnectHeader{Early: []byte("hello")})
	if g := recvTimeout(t, got, "the server's reading"); g != "hello" {
		t.Errorf("server read %q, want the early bytes", g)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// rawServer does a server's side of the HTTP/2 handshake on sc by hand:
// SETTINGS (with settings), then the client's preface. nextStreamFrame
// acknowledges the client's SETTINGS.
func rawServer(sc *tls.Conn, settings []http2.Setting) *http2.Framer {
	fr := http2.NewFramer(sc, sc)
	_ = fr.WriteSettings(settings...)
	_, _ = io.ReadFull(sc, make([]byte, len(http2.ClientPreface)))
	return fr
}

// nextStreamFrame returns the next frame that is not connection control
// (SETTINGS, WINDOW_UPDATE of the connection, PING), or nil on an error.
func nextStreamFrame(fr *http2.Framer) http2.Frame {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return nil
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
			continue
		case *http2.PingFrame:
			continue
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				continue
			}
		}
		return f
	}
}

// respond sends response HEADERS with status on stream id.
func respond(fr *http2.Framer, id uint32, status string) {
	var b bytes.Buffer
	_ = hpack.NewEncoder(&b).WriteField(hpack.HeaderField{Name: ":status", Value: status})
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b.Bytes(), EndHeaders: true})
}
