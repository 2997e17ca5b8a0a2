package hbone

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// conn is one HTTP/2 connection over TLS carrying CONNECT streams, client
// or server side. It is built on x/net/http2's Framer and hpack, not on
// http2.Transport/Server: those give every stream a pipe, a frame-sized
// scratch buffer and a writer goroutine, and hand every write to another
// goroutine. On a VM a goroutine hand-off that wakes a thread costs tens
// of µs, more than the syscalls it wraps, so here:
//
//   - one reader goroutine per connection reads frames and delivers DATA
//     straight into the destination socket when it will not block (see
//     stream.go), so a request crosses no goroutine inside ztunnel;
//   - writes need no goroutine: the caller that finds the writer free
//     writes its frame itself, and frames from callers that arrive while
//     it writes are appended to a pending buffer it writes next (flat
//     combining), so concurrent streams share TLS records and syscalls;
//   - an idle stream holds no buffer and, on the proxy's path, at most one
//     parked goroutine.
//
// Lock order: wmu may be taken while holding nothing or mu; mu and a
// stream's rmu must never be held while waiting for wmu.
type conn struct {
	// Immutable after newConn.
	client     bool
	w          wire
	br         *bufio.Reader
	rfr        *http2.Framer // read side; only the reader goroutine uses it
	log        *slog.Logger
	countError func(string)
	// onStream (server) is called on the reader goroutine for each new
	// stream with its request headers; it must not block.
	onStream func(*h2stream, *http2.MetaHeadersFrame)
	// onClose runs once, after the connection closed.
	onClose    func(*conn)
	maxStreams uint32        // server: our SETTINGS_MAX_CONCURRENT_STREAMS
	settingsc  chan struct{} // closed when the peer's first SETTINGS arrived
	done       chan struct{} // closed when the connection is closed
	readCount  atomic.Uint64 // frames read: the keepalive's sign of life

	// Writer, guarded by wmu.
	wmu      sync.Mutex
	wcond    sync.Cond // L = &wmu: room in wbuf, or a flush ended
	turn     sync.Cond // L = &wmu: a flush ended; wakes one large-frame writer
	wbuf     *[]byte   // frames waiting for the flusher; nil while idle
	spare    *[]byte   // the other half of the double buffer
	flushing bool      // a goroutine is writing to the socket
	werr     error     // sticky: the connection can no longer write
	wfr      *http2.Framer
	henc     *hpack.Encoder
	hbuf     bytes.Buffer
	nextID   uint32 // client: the next stream id to open

	// Connection state, guarded by mu.
	mu           sync.Mutex
	sendCond     sync.Cond // L = &mu: send window grew, or a stream/conn ended
	streams      map[uint32]*h2stream
	sendWin      int64  // what the peer lets us send on the connection
	recvWin      int64  // what we let the peer send on the connection
	recvUnacked  int64  // consumed, not yet returned by WINDOW_UPDATE
	peerInitWin  int64  // peer SETTINGS_INITIAL_WINDOW_SIZE
	peerMaxFrame int    // peer SETTINGS_MAX_FRAME_SIZE
	peerStreams  uint32 // peer SETTINGS_MAX_CONCURRENT_STREAMS, 0 = none said
	gotSettings  bool
	maxSeenID    uint32 // server: highest stream id the client opened
	goAwayRecv   bool
	goAwayID     uint32 // last stream id in the GOAWAY received
	goAwaySent   bool
	closed       bool
	closeErr     error
	keepalive    *time.Timer
	lastSeen     uint64 // readCount at the previous keepalive tick
	idleTicks    int
}

// Errors a stream or Connect can see from the connection.
var (
	errConnClosed = errors.New("hbone: connection closed")
	// errClosedAfterHandshake: the peer closed a new connection cleanly
	// before it could carry a stream; nothing was sent on it.
	errClosedAfterHandshake = errors.New("hbone: peer closed the connection")
	errGoAway               = errors.New("hbone: connection going away")
	errStreamRefused        = errors.New("hbone: stream refused")
	errTooManyOpen          = errors.New("hbone: peer's concurrent stream limit reached")
)

// Frame sizes and thresholds of the implementation.
const (
	frameHeaderLen = 9
	// defaultWindow is HTTP/2's initial window before SETTINGS.
	defaultWindow = 65535
	// maxPending bounds frames waiting behind a write in progress. A
	// stream that finds it full waits, so a bulk stream can put at most
	// about one frame ahead of a small one (head-of-line fairness).
	maxPending = 64 << 10
	// readBufSize is the buffer between TLS and the frame reader, per
	// connection. Frame headers and small frames come from it; a large
	// DATA payload is read past it straight from TLS, so 4 KiB costs no
	// throughput (BenchmarkThroughput) and saves 12 KiB per connection
	// against one TLS record (BenchmarkIdleConn: 86 → 59 KB, both ends).
	readBufSize = 4 << 10
)

type connOptions struct {
	client     bool
	log        *slog.Logger
	countError func(string)
	onStream   func(*h2stream, *http2.MetaHeadersFrame)
	onClose    func(*conn)
	maxStreams uint32
}

// wire is what a conn reads and writes: the TLS connection (batchTLS),
// or memory in fuzz tests.
type wire interface {
	io.Reader
	// Write is io.Writer's, except that it may change p's bytes while it
	// runs (it puts them back before it returns): the record layer
	// borrows the byte after each record's content for the record's type
	// byte. Callers own p for the call.
	io.Writer
	// closeNow closes the underlying socket at once (no close_notify,
	// which could block on a peer that does not read).
	closeNow() error
	// roomNow reports whether the socket would take a small write at
	// once; false when it cannot tell.
	roomNow() bool
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
}

// newConn wraps an established TLS connection. The caller sends the
// preface (startClient or startServer) and then runs readLoop.
func newConn(w wire, o connOptions) *conn {
	c := &conn{
		client:       o.client,
		w:            w,
		br:           bufio.NewReaderSize(w, readBufSize),
		log:          o.log,
		countError:   o.countError,
		onStream:     o.onStream,
		onClose:      o.onClose,
		maxStreams:   o.maxStreams,
		settingsc:    make(chan struct{}),
		done:         make(chan struct{}),
		streams:      make(map[uint32]*h2stream),
		sendWin:      defaultWindow,
		recvWin:      connWindow,
		peerInitWin:  defaultWindow,
		peerMaxFrame: 16 << 10,
		nextID:       1,
	}
	if c.countError == nil {
		c.countError = func(string) {}
	}
	c.wcond.L = &c.wmu
	c.turn.L = &c.wmu
	c.sendCond.L = &c.mu
	c.rfr = http2.NewFramer(nil, c.br)
	c.rfr.SetMaxReadFrameSize(maxFrameSize)
	c.rfr.SetReuseFrames()
	c.rfr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if c.client {
		c.rfr.MaxHeaderListSize = clientMaxHeaderList
	} else {
		c.rfr.MaxHeaderListSize = serverMaxHeaderBytes
	}
	c.wfr = http2.NewFramer(pendingWriter{c}, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c
}

// startClient sends the client preface, our SETTINGS and the connection
// window, in one write.
func (c *conn) startClient() error {
	return c.writeControl(false, func() {
		c.appendLocked([]byte(http2.ClientPreface))
		c.writeSettingsLocked(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameSize},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: clientMaxHeaderList},
		)
	})
}

// startServer reads the client preface and sends our SETTINGS.
func (c *conn) startServer() error {
	var pre [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, pre[:]); err != nil {
		return fmt.Errorf("hbone: read client preface: %w", err)
	}
	if string(pre[:]) != http2.ClientPreface {
		return errors.New("hbone: bad client preface")
	}
	return c.writeControl(false, func() {
		c.writeSettingsLocked(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.maxStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameSize},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: serverMaxHeaderBytes},
		)
	})
}

func (c *conn) writeSettingsLocked(s ...http2.Setting) {
	_ = c.wfr.WriteSettings(s...)
	_ = c.wfr.WriteWindowUpdate(0, connWindow-defaultWindow)
}

// waitSettings waits for the peer's first SETTINGS frame.
func (c *conn) waitSettings(timeout <-chan struct{}) error {
	select {
	case <-c.settingsc:
		return nil
	case <-c.done:
		return c.err()
	case <-timeout:
		return errors.New("hbone: no SETTINGS from peer")
	}
}

// setupErr says how far a new connection got when err ended its setup
// (preface, SETTINGS): a clean close by the peer this early says little by
// itself, while whether the peer's SETTINGS came first tells a server
// that dropped the connection from one that refused it later.
func (c *conn) setupErr(err error) error {
	if err != errConnClosed {
		return err
	}
	select {
	case <-c.settingsc:
		return fmt.Errorf("%w right after its SETTINGS (%d frames read)", errClosedAfterHandshake, c.readCount.Load())
	default:
		return fmt.Errorf("%w before its SETTINGS (%d frames read)", errClosedAfterHandshake, c.readCount.Load())
	}
}

// err is why the connection closed.
func (c *conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeErr != nil {
		return c.closeErr
	}
	return errConnClosed
}

// --- closing ---

// close closes the connection at once: every stream fails with err.
// Safe to call more than once.
func (c *conn) close(err error) {
	if err == nil {
		err = errConnClosed
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.closeErr = err
	streams := make([]*h2stream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	clear(c.streams)
	if c.keepalive != nil {
		c.keepalive.Stop()
	}
	c.sendCond.Broadcast()
	c.mu.Unlock()

	c.wmu.Lock()
	if c.werr == nil {
		c.werr = err
	}
	c.wcond.Broadcast()
	c.turn.Broadcast()
	c.wmu.Unlock()

	_ = c.w.closeNow()
	close(c.done)
	for _, s := range streams {
		s.fail(err)
	}
	if c.onClose != nil {
		c.onClose(c)
	}
}

// goAway sends GOAWAY: no new streams. The connection closes when its
// last stream ends (or at once if it has none). It does not wait for the
// socket.
func (c *conn) goAway(code http2.ErrCode) {
	c.mu.Lock()
	if c.goAwaySent || c.closed {
		c.mu.Unlock()
		return
	}
	c.goAwaySent = true
	last := c.maxSeenID
	idle := len(c.streams) == 0
	c.mu.Unlock()
	_ = c.writeControl(true, func() { _ = c.wfr.WriteGoAway(last, code, nil) })
	if idle {
		go c.closeGracefully(errGoAway)
	}
}

// closeGracefully closes once what was queued has been written, or after
// flushTimeout if the peer does not read it.
func (c *conn) closeGracefully(err error) {
	t := time.AfterFunc(flushTimeout, func() { c.close(err) })
	defer t.Stop()
	c.wmu.Lock()
	for c.flushing && c.werr == nil {
		c.wcond.Wait()
	}
	c.wmu.Unlock()
	c.close(err)
}

// flushTimeout bounds how long a closing connection waits to deliver its
// last frames (GOAWAY, END_STREAM) to a peer that does not read.
const flushTimeout = time.Second

// shutdown sends GOAWAY and waits for the streams to end; at ctx's end
// it closes the connection and returns ctx.Err().
func (c *conn) shutdown(ctx context.Context) error {
	c.goAway(http2.ErrCodeNo)
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		c.close(errGoAway)
		return ctx.Err()
	}
}

// openStream opens a client stream: it allocates the stream id and queues
// the CONNECT HEADERS under one lock, so ids reach the wire in order.
// early, if the flow-control windows hold all of it, follows the HEADERS
// as one DATA frame in the same write (sent reports it); otherwise it is
// left to the caller.
func (c *conn) openStream(fields []hpack.HeaderField, early []byte) (s *h2stream, sent bool, err error) {
	c.wmu.Lock()
	if c.werr != nil {
		err := c.werr
		c.wmu.Unlock()
		return nil, false, err
	}
	c.mu.Lock()
	switch {
	case c.closed || c.goAwayRecv || c.goAwaySent:
		err = errGoAway
	case c.nextID > maxStreamID:
		c.goAwaySent = true // ids exhausted: retire the connection
		err = errGoAway
	case c.peerStreams > 0 && len(c.streams) >= int(c.peerStreams):
		err = errTooManyOpen
	}
	if err != nil {
		c.mu.Unlock()
		c.wmu.Unlock()
		return nil, false, err
	}
	id := c.nextID
	c.nextID += 2
	s = newH2Stream(c, id, c.peerInitWin)
	c.streams[id] = s
	if n := int64(len(early)); n > 0 && n <= s.sendWin && n <= c.sendWin && n <= int64(c.peerMaxFrame) && n <= appendMax-frameHeaderLen {
		s.sendWin -= n
		c.sendWin -= n
		sent = true
	}
	c.mu.Unlock()
	c.writeHeadersLocked(id, false, fields)
	if sent {
		var h [frameHeaderLen]byte
		putDataHeader(h[:], len(early), false, id)
		c.appendLocked(h[:])
		c.appendLocked(early)
	}
	if err := c.kickLocked(false); err != nil {
		return nil, false, err
	}
	return s, sent, nil
}

// maxStreamID is the largest stream id HTTP/2 allows.
const maxStreamID = 1<<31 - 1

// closing reports whether the connection takes no new streams.
func (c *conn) closing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed || c.goAwayRecv || c.goAwaySent
}

// maxConcurrent is the peer's stream limit, 0 if it set none.
func (c *conn) maxConcurrent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.peerStreams)
}

// removeStream forgets a finished stream; a connection that is going
// away closes with its last stream.
func (c *conn) removeStream(s *h2stream) {
	c.mu.Lock()
	if c.streams[s.id] != s {
		c.mu.Unlock()
		return
	}
	delete(c.streams, s.id)
	last := len(c.streams) == 0 && (c.goAwaySent || c.goAwayRecv) && !c.closed
	c.mu.Unlock()
	if last {
		go c.closeGracefully(errGoAway)
	}
}

// --- keepalive ---

// startKeepalive pings a connection that has been silent for
// pingInterval and closes it when it stays silent for pingTimeout
// (upstream: ping after 10 s, give up after 20 s). A timer, not a
// goroutine; busy connections only pay for the frame counter.
func (c *conn) startKeepalive() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.keepalive = time.AfterFunc(pingInterval, c.keepaliveTick)
	}
}

func (c *conn) keepaliveTick() {
	n := c.readCount.Load()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if n != c.lastSeen {
		c.lastSeen, c.idleTicks = n, 0
	} else {
		c.idleTicks++
	}
	ticks := c.idleTicks
	c.keepalive.Reset(pingInterval)
	c.mu.Unlock()
	switch {
	case ticks*int(pingInterval) >= int(pingTimeout):
		c.countError("ping_timeout")
		c.close(errors.New("hbone: peer stopped answering PING"))
	case ticks > 0:
		var data [8]byte
		_, _ = rand.Read(data[:])
		_ = c.writeControl(true, func() { _ = c.wfr.WritePing(false, data) })
	}
}

// localAddr and remoteAddr of the TCP connection.
func (c *conn) localAddr() net.Addr  { return c.w.LocalAddr() }
func (c *conn) remoteAddr() net.Addr { return c.w.RemoteAddr() }
