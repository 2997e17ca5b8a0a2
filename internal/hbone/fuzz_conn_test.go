package hbone

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// memWire is a wire that reads fixed bytes and discards writes.
type memWire struct {
	r      io.Reader
	closed chan struct{}
}

func (w *memWire) Read(p []byte) (int, error) {
	return w.r.Read(p) // io.EOF at the end: the peer closed
}
func (w *memWire) Write(p []byte) (int, error) { return len(p), nil }

// roomNow: memory cannot tell, so control frames from the reader take
// the goroutine path.
func (w *memWire) roomNow() bool { return false }

func (w *memWire) closeNow() error {
	select {
	case <-w.closed:
	default:
		close(w.closed)
	}
	return nil
}
func (w *memWire) LocalAddr() net.Addr  { return &net.TCPAddr{} }
func (w *memWire) RemoteAddr() net.Addr { return &net.TCPAddr{} }

// frames builds a seed: SETTINGS then the frames fill writes.
func frames(fill func(fr *http2.Framer)) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	fill(fr)
	return b.Bytes()
}

func headerBlock(kv ...string) []byte {
	var b bytes.Buffer
	e := hpack.NewEncoder(&b)
	for i := 0; i+1 < len(kv); i += 2 {
		e.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return b.Bytes()
}

// runConn feeds data to a conn's reader until it ends; it must end (the
// input is finite) without a panic, leaving no stream behind.
func runConn(t *testing.T, client bool, data []byte) {
	w := &memWire{closed: make(chan struct{})}
	var in io.Reader = bytes.NewReader(data)
	if !client {
		in = io.MultiReader(bytes.NewReader([]byte(http2.ClientPreface)), in)
	}
	w.r = in
	var started []*h2stream
	c := newConn(w, connOptions{
		client:     client,
		log:        slog.New(slog.DiscardHandler),
		maxStreams: 4,
		onStream:   func(s *h2stream, _ *http2.MetaHeadersFrame) { started = append(started, s) },
	})
	if client {
		// Two open streams for the input's frames to land on.
		for range 2 {
			if _, _, err := c.openStream(connectFields("10.0.0.1:80", nil), nil); err != nil {
				t.Fatal(err)
			}
		}
	} else if err := c.startServer(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		c.readLoop()
		close(done)
	}()
	// The reader ends at the input's end or at a connection error.
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("reader did not stop")
	}
	c.close(nil)
	// Streams started by the reader finish like a Handler would.
	for _, s := range started {
		s.resetWith(http2.ErrCodeCancel, false, net.ErrClosed)
	}
}

// FuzzServerFrames: whatever a client sends after the preface, the
// server's frame handling neither panics nor hangs.
func FuzzServerFrames(f *testing.F) {
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: headerBlock(":method", "CONNECT", ":authority", "10.0.0.1:80")})
		fr.WriteData(1, false, []byte("hello"))
		fr.WriteWindowUpdate(1, 100)
		fr.WriteData(1, true, nil)
		fr.WriteRSTStream(1, http2.ErrCodeCancel)
		fr.WritePing(false, [8]byte{1})
		fr.WriteGoAway(1, http2.ErrCodeNo, nil)
	}))
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: headerBlock(":method", "CONNECT")})
		fr.WriteContinuation(3, true, headerBlock(":authority", "[::1]:8080", "baggage", "k8s.namespace.name=a"))
		fr.WriteDataPadded(3, false, []byte("x"), []byte{0, 0, 0})
		fr.WriteData(5, false, []byte("idle stream"))
	}))
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
		fr.WriteWindowUpdate(0, 1<<31-1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, EndHeaders: true, BlockFragment: headerBlock(":method", "GET")})
	}))
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) { runConn(t, false, data) })
}

// FuzzClientFrames: whatever a server sends on a connection with open
// streams, the client's frame handling neither panics nor hangs.
func FuzzClientFrames(f *testing.F) {
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: headerBlock(":status", "200", "baggage", "x=y")})
		fr.WriteData(1, false, []byte("world"))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndHeaders: true, EndStream: true, BlockFragment: headerBlock(":status", "401")})
		fr.WriteData(1, true, nil)
		fr.WriteGoAway(1, http2.ErrCodeNo, nil)
	}))
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: headerBlock(":status", "100")})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: headerBlock(":status", "bad")})
		fr.WriteRSTStream(3, http2.ErrCodeRefusedStream)
		fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, EndHeaders: true})
	}))
	f.Fuzz(func(t *testing.T, data []byte) { runConn(t, true, data) })
}
