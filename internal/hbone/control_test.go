package hbone

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// gateWire is a wire that says whether the socket has room as the test
// sets it, and whose writes report which goroutine made them and wait
// for the test to let them finish.
type gateWire struct {
	memWire
	room    bool
	writes  chan gateWrite
	release chan struct{}
}

type gateWrite struct {
	frames []byte
	async  bool // made by a goroutine started to write (flushAsync)
}

func newGateWire(room bool) *gateWire {
	return &gateWire{
		memWire: memWire{r: bytes.NewReader(nil), closed: make(chan struct{})},
		room:    room,
		writes:  make(chan gateWrite, 4),
		release: make(chan struct{}, 4),
	}
}

func (w *gateWire) roomNow() bool { return w.room }

func (w *gateWire) Write(p []byte) (int, error) {
	stack := make([]byte, 8<<10)
	stack = stack[:runtime.Stack(stack, false)]
	w.writes <- gateWrite{frames: bytes.Clone(p), async: bytes.Contains(stack, []byte("flushAsync"))}
	<-w.release
	return len(p), nil
}

func (w *gateWire) next(t *testing.T) gateWrite {
	t.Helper()
	return recvTimeout(t, w.writes, "a write")
}

func newGateConn(w *gateWire) *conn {
	return newConn(w, connOptions{client: true, log: slog.New(slog.DiscardHandler)})
}

// TestControlFromReaderInline: a control frame from the reader goroutine
// (async) is written by that goroutine when the socket has room for it,
// and by a new goroutine when it has not, when the frames are more than a
// few, or (after the first write) for what was appended meanwhile.
func TestControlFromReaderInline(t *testing.T) {
	ping := func(c *conn, b byte) func() {
		return func() { _ = c.wfr.WritePing(false, [8]byte{b}) }
	}
	t.Run("room", func(t *testing.T) {
		w := newGateWire(true)
		c := newGateConn(w)
		w.release <- struct{}{}
		if err := c.writeControl(true, ping(c, 1)); err != nil {
			t.Fatal(err)
		}
		if got := w.next(t); got.async {
			t.Fatal("a PING with room in the socket was handed to a new goroutine")
		}
	})
	t.Run("no room", func(t *testing.T) {
		w := newGateWire(false)
		c := newGateConn(w)
		returned := make(chan error, 1)
		go func() { returned <- c.writeControl(true, ping(c, 1)) }()
		// The caller is back while the write still waits: it did not
		// make it.
		recvTimeout(t, returned, "writeControl's return")
		if got := w.next(t); !got.async {
			t.Fatal("the reader wrote to a socket without room")
		}
		w.release <- struct{}{}
	})
	t.Run("large", func(t *testing.T) {
		w := newGateWire(true)
		c := newGateConn(w)
		w.release <- struct{}{}
		debug := make([]byte, inlineControlMax)
		if err := c.writeControl(true, func() { _ = c.wfr.WriteGoAway(0, http2.ErrCodeNo, debug) }); err != nil {
			t.Fatal(err)
		}
		if got := w.next(t); !got.async {
			t.Fatalf("%d bytes of frames were written by the reader", len(got.frames))
		}
	})
	t.Run("appended meanwhile", func(t *testing.T) {
		w := newGateWire(true)
		c := newGateConn(w)
		returned := make(chan error, 1)
		go func() { returned <- c.writeControl(true, ping(c, 1)) }()
		if got := w.next(t); got.async {
			t.Fatal("first PING not written inline")
		}
		// The reader is in its write: a second frame queues behind it.
		if err := c.writeControl(false, ping(c, 2)); err != nil {
			t.Fatal(err)
		}
		w.release <- struct{}{}
		recvTimeout(t, returned, "writeControl's return")
		second := w.next(t)
		if !second.async {
			t.Fatal("the reader went on to write what was appended while it wrote")
		}
		fr, err := http2.NewFramer(nil, bytes.NewReader(second.frames)).ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := fr.(*http2.PingFrame); !ok || p.Data[0] != 2 {
			t.Fatalf("second write holds %v, want the second PING", fr)
		}
		w.release <- struct{}{}
		waitFor(t, "the writer's turn to end", func() bool {
			c.wmu.Lock()
			defer c.wmu.Unlock()
			return !c.flushing
		})
	})
}

// TestRoomNow: poll on a real socket says there is room on a fresh
// connection, none once the peer stopped reading and the send buffer
// filled, and room again after the peer drained it.
func TestRoomNow(t *testing.T) {
	d, peer := tcpPair(t)
	raw := newRawNetConn(d)
	rn, ok := raw.(*rawNetConn)
	if !ok {
		t.Skip("direct socket I/O is off")
	}
	if !rn.io.roomNow() {
		t.Fatal("no room on a fresh connection")
	}
	// Fill the send buffer and the peer's receive buffer.
	chunk := make([]byte, 256<<10)
	for {
		_ = d.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := d.Write(chunk); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			break
		}
	}
	if rn.io.roomNow() {
		t.Fatal("room reported on a full socket")
	}
	go func() {
		buf := make([]byte, 256<<10)
		for {
			if _, err := peer.Read(buf); err != nil {
				return
			}
		}
	}()
	waitFor(t, "room after the peer read", rn.io.roomNow)
}

// TestPeerCloseLogged: a peer that ends the connection under open streams
// leaves a warning saying what it sent first — a GOAWAY with an error code
// (and its debug data), then the close with the streams still open.
func TestPeerCloseLogged(t *testing.T) {
	var logs bytes.Buffer
	w := &memWire{closed: make(chan struct{})}
	w.r = bytes.NewReader(frames(func(fr *http2.Framer) {
		fr.WriteSettings()
		fr.WriteGoAway(3, http2.ErrCodeEnhanceYourCalm, []byte("too_many_resets"))
	}))
	c := newConn(w, connOptions{client: true, log: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 2 {
		if _, _, err := c.openStream(connectFields("10.0.0.1:80", nil), nil); err != nil {
			t.Fatal(err)
		}
	}
	c.readLoop() // returns at the input's end: the peer's close
	for _, want := range []string{
		`msg="hbone: peer closed the connection with an error"`,
		`code=ENHANCE_YOUR_CALM lastStream=3 debug=too_many_resets`,
		`msg="hbone: peer closed the connection with streams open"`,
		`streams=2 goAway=true goAwayLastStream=3`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
