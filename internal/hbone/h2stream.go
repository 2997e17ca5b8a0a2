package hbone

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// h2stream is one CONNECT stream, the state both sides share: received
// bytes on their way to a reader or a sink, the send window, and how the
// stream ended. Stream (client) and ServerStream wrap it.
type h2stream struct {
	// Immutable after creation.
	c      *conn
	id     uint32
	signal chan struct{} // cap 1: something changed on the receive side
	onEnd  func()        // server: cancels the Handler's context; may be nil

	// Receive side, guarded by rmu.
	rmu         sync.Mutex
	rq          []chunk // received, not yet consumed
	rEOF        bool    // END_STREAM received
	rErr        error   // reads fail with this (reset, connection lost)
	rStop       bool    // we stopped reading: drop what arrives
	sink        *sink   // CopyTo in progress
	sinkBusy    bool    // the sink's writer goroutine is writing queued bytes
	sinkErr     error   // the sink failed
	recvWin     int64   // what the peer may still send
	recvUnacked int64   // consumed, not yet returned by WINDOW_UPDATE
	respReady   bool    // client: final response (or failure) recorded
	respc       chan struct{}
	status      int
	header      http.Header
	respErr     error

	// Send side and lifecycle, guarded by c.mu.
	sendWin   int64
	wClosed   bool  // END_STREAM or RST_STREAM sent (or queued)
	sendErr   error // writes fail with this
	resetDone bool  // RST_STREAM sent or received
	ended     bool  // onEnd ran
}

type chunk struct {
	buf *[]byte
	b   []byte // unread part of *buf
}

func newH2Stream(c *conn, id uint32, sendWin int64) *h2stream {
	return &h2stream{
		c:       c,
		id:      id,
		signal:  make(chan struct{}, 1),
		recvWin: streamWindow,
		sendWin: sendWin,
		respc:   make(chan struct{}),
	}
}

// notify wakes the goroutine waiting on the receive side, if any.
func (s *h2stream) notify() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// ResetError is the error a stream's reads and writes return after the
// peer reset it (RST_STREAM).
type ResetError struct{ Code http2.ErrCode }

func (e ResetError) Error() string { return "hbone: stream reset by peer: " + e.Code.String() }

// --- receive side ---

// onData takes a DATA frame (or END_STREAM alone) on the reader
// goroutine. flow is the frame's flow-controlled length (with padding).
// With a sink attached and nothing queued, data goes straight into the
// sink's socket if that does not block, so neither a copy nor another
// goroutine is involved.
func (s *h2stream) onData(data []byte, flow int64, end bool) {
	s.rmu.Lock()
	if flow > s.recvWin {
		s.rmu.Unlock()
		s.c.credit(nil, 0, flow, true)
		s.resetWith(http2.ErrCodeFlowControl, true, errors.New("hbone: peer overran the stream window"))
		return
	}
	if s.rEOF && (flow > 0 || end) {
		s.rmu.Unlock()
		s.c.credit(nil, 0, flow, true)
		s.resetWith(http2.ErrCodeStreamClosed, true, errors.New("hbone: DATA after END_STREAM"))
		return
	}
	s.recvWin -= flow
	consumed := flow - int64(len(data)) // padding
	switch {
	case len(data) == 0:
	case s.rStop || s.rErr != nil:
		consumed = flow
	case s.sink != nil && s.sink.rc != nil && !s.sinkBusy && len(s.rq) == 0:
		n, err := s.sink.tryWrite(data)
		consumed += int64(n)
		if err != nil {
			s.sinkErr, s.rStop = err, true
			consumed = flow
			s.notify()
		} else if n < len(data) {
			s.push(data[n:])
			s.startDrainLocked()
		}
	default:
		s.push(data)
		if s.sink != nil && !s.sinkBusy {
			s.startDrainLocked()
		} else {
			s.notify()
		}
	}
	if end {
		s.rEOF = true
		s.notify()
	}
	inc := s.streamCreditLocked(consumed)
	done, derr := s.takeDoneLocked()
	s.rmu.Unlock()
	s.c.credit(s, inc, consumed, true)
	if done != nil {
		done(derr)
	}
}

// push queues a copy of p. Called with rmu held.
func (s *h2stream) push(p []byte) {
	for len(p) > 0 {
		b := getBuf(len(p))
		n := copy((*b)[:cap(*b)], p)
		s.rq = append(s.rq, chunk{buf: b, b: (*b)[:n]})
		p = p[n:]
	}
}

// dropQueueLocked frees what is queued and returns how many bytes that
// was, for flow control.
func (s *h2stream) dropQueueLocked() int64 {
	var n int64
	for _, ch := range s.rq {
		n += int64(len(ch.b))
		putBuf(ch.buf)
	}
	clear(s.rq)
	s.rq = s.rq[:0]
	return n
}

// streamCreditLocked counts n consumed bytes and returns the stream
// WINDOW_UPDATE increment to send now, if any. Updates are batched so
// small messages don't each cost a frame. While the sender has less than
// half the window left, it is (or soon may be) held by the window, and
// would send what an update frees as one burst that every other stream
// on the connection queues behind: then updates go out every
// streamUpdateEvery. Otherwise — the reader keeps up — every
// streamUpdateKeepingUp: there the updates hold nobody back and only cost
// each side a syscall and the sender a wake-up.
func (s *h2stream) streamCreditLocked(n int64) uint32 {
	if n <= 0 || s.rEOF || s.rStop || s.rErr != nil {
		return 0
	}
	s.recvUnacked += n
	every := int64(streamUpdateKeepingUp)
	if s.recvWin < streamWindow/2 {
		every = streamUpdateEvery
	}
	if s.recvUnacked < every {
		return 0
	}
	inc := s.recvUnacked
	s.recvUnacked = 0
	s.recvWin += inc
	return uint32(inc)
}

// credit returns n consumed bytes to the connection window and sends the
// WINDOW_UPDATEs that are due (streamInc for s).
func (c *conn) credit(s *h2stream, streamInc uint32, n int64, async bool) {
	var connInc int64
	if n > 0 {
		c.mu.Lock()
		c.recvUnacked += n
		if c.recvUnacked >= connWindow/4 {
			connInc = c.recvUnacked
			c.recvUnacked = 0
			c.recvWin += connInc
		}
		c.mu.Unlock()
	}
	if streamInc == 0 && connInc == 0 {
		return
	}
	_ = c.writeControl(async, func() {
		if streamInc > 0 {
			_ = c.wfr.WriteWindowUpdate(s.id, streamInc)
		}
		if connInc > 0 {
			_ = c.wfr.WriteWindowUpdate(0, uint32(connInc))
		}
	})
}

// read copies received bytes into p, waiting for some.
func (s *h2stream) read(p []byte) (int, error) {
	s.rmu.Lock()
	for len(s.rq) == 0 && !s.rEOF && s.rErr == nil && !s.rStop {
		s.rmu.Unlock()
		<-s.signal
		s.rmu.Lock()
	}
	if len(s.rq) == 0 {
		err := s.rErr
		if err == nil {
			err = io.EOF
		}
		s.rmu.Unlock()
		return 0, err
	}
	n := 0
	for n < len(p) && len(s.rq) > 0 {
		ch := &s.rq[0]
		m := copy(p[n:], ch.b)
		n += m
		ch.b = ch.b[m:]
		if len(ch.b) == 0 {
			putBuf(ch.buf)
			s.rq[0] = chunk{}
			s.rq = s.rq[1:]
		}
	}
	if len(s.rq) == 0 {
		s.rq = nil
	}
	inc := s.streamCreditLocked(int64(n))
	s.rmu.Unlock()
	s.c.credit(s, inc, int64(n), false)
	return n, nil
}

// --- send side ---

// awaitSend reserves up to want bytes of send window, at most one frame,
// waiting until the peer grants some.
func (s *h2stream) awaitSend(want int) (int, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case s.sendErr != nil:
			return 0, s.sendErr
		case c.closed:
			return 0, c.closeErr
		case s.wClosed:
			return 0, net.ErrClosed
		}
		w := min(int64(want), s.sendWin, c.sendWin, int64(c.peerMaxFrame))
		if w > 0 {
			s.sendWin -= w
			c.sendWin -= w
			return int(w), nil
		}
		c.sendCond.Wait()
	}
}

// sendData sends buf[frameHeaderLen:] as DATA frames within the flow
// control windows. buf[:frameHeaderLen] is free room for a frame header,
// so a frame needs no copy; when the window splits the payload, the next
// header overwrites the last bytes already handed to the connection.
func (s *h2stream) sendData(buf []byte) error {
	off := 0
	for rest := len(buf) - frameHeaderLen; rest > 0; {
		n, err := s.awaitSend(rest)
		if err != nil {
			return err
		}
		putDataHeader(buf[off:], n, false, s.id)
		if err := s.c.writeFrame(buf[off : off+frameHeaderLen+n]); err != nil {
			return err
		}
		off += n
		rest -= n
	}
	return nil
}

// write sends p; it returns once p was written or queued on the
// connection.
func (s *h2stream) write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		m := min(len(p), maxReadSize)
		b := getBuf(frameHeaderLen + m)
		copy((*b)[frameHeaderLen:], p[:m])
		err := s.sendData((*b)[:frameHeaderLen+m])
		putBuf(b)
		if err != nil {
			return written, err
		}
		written += m
		p = p[m:]
	}
	return written, nil
}

// CopyFrom sends what src yields until its EOF (nil) or an error,
// counting bytes into n (may be nil). Reading a socket, it holds a buffer
// only while bytes are there to read (see source). It does not end the
// stream: CloseWrite does.
func (s *h2stream) CopyFrom(src io.Reader, n *atomic.Int64) (int64, error) {
	rd := newSource(src)
	var total int64
	for {
		s.c.mu.Lock()
		limit := min(s.c.peerMaxFrame, maxReadSize)
		s.c.mu.Unlock()
		b, nr, rerr := rd.read(limit)
		if nr > 0 {
			if err := s.sendData((*b)[:frameHeaderLen+nr]); err != nil {
				putBuf(b)
				return total, err
			}
			total += int64(nr)
			if n != nil {
				n.Add(int64(nr))
			}
		}
		if b != nil {
			putBuf(b)
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// closeWrite sends END_STREAM: we send nothing more; reading goes on.
func (s *h2stream) closeWrite() error {
	c := s.c
	c.mu.Lock()
	if s.wClosed || s.sendErr != nil || c.closed {
		c.mu.Unlock()
		return nil
	}
	s.wClosed = true
	c.mu.Unlock()
	return c.writeControl(false, func() { _ = c.wfr.WriteData(s.id, true, nil) })
}

// --- ending ---

// resetWith aborts the stream: RST_STREAM with code (unless one was
// already sent or received), reads and writes fail with err. async is set
// on the reader goroutine, which must not wait on the socket (see
// writeControl).
func (s *h2stream) resetWith(code http2.ErrCode, async bool, err error) {
	c := s.c
	c.mu.Lock()
	send := !s.resetDone && !c.closed
	s.resetDone, s.wClosed = true, true
	if s.sendErr == nil {
		s.sendErr = err
	}
	c.sendCond.Broadcast()
	c.mu.Unlock()
	s.failRecv(err)
	if send {
		_ = c.writeControl(async, func() { _ = c.wfr.WriteRSTStream(s.id, code) })
	}
	s.end()
}

// onReset handles the peer's RST_STREAM. NO_ERROR after a complete
// response only stops our sending: what was received stays readable.
func (s *h2stream) onReset(code http2.ErrCode) {
	c := s.c
	err := error(ResetError{Code: code})
	if code == http2.ErrCodeRefusedStream {
		err = errStreamRefused
	}
	c.mu.Lock()
	s.resetDone, s.wClosed = true, true
	if s.sendErr == nil {
		s.sendErr = err
	}
	c.sendCond.Broadcast()
	c.mu.Unlock()
	s.rmu.Lock()
	graceful := code == http2.ErrCodeNo && s.rEOF
	s.rmu.Unlock()
	if !graceful {
		s.failRecv(err)
	}
	s.end()
}

// fail ends the stream because the connection ended or refused it.
func (s *h2stream) fail(err error) {
	c := s.c
	c.mu.Lock()
	s.wClosed = true
	if s.sendErr == nil {
		s.sendErr = err
	}
	c.mu.Unlock()
	s.failRecv(err)
	s.end()
}

// failRecv makes reads fail with err and drops what was queued.
func (s *h2stream) failRecv(err error) {
	s.rmu.Lock()
	if s.rErr == nil {
		s.rErr = err
	}
	s.rStop = true
	dropped := s.dropQueueLocked()
	if !s.respReady {
		s.respReady, s.respErr = true, err
		close(s.respc)
	}
	s.notify()
	done, derr := s.takeDoneLocked()
	s.rmu.Unlock()
	s.c.credit(nil, 0, dropped, true)
	if done != nil {
		done(derr)
	}
}

// stopReading drops what arrives from now on (the application will not
// read it); flow control keeps being returned for the connection.
func (s *h2stream) stopReading() {
	s.rmu.Lock()
	s.rStop = true
	dropped := s.dropQueueLocked()
	s.notify()
	done, derr := s.takeDoneLocked()
	s.rmu.Unlock()
	s.c.credit(nil, 0, dropped, false)
	if done != nil {
		done(derr)
	}
}

func (s *h2stream) end() {
	c := s.c
	c.mu.Lock()
	run := !s.ended
	s.ended = true
	c.mu.Unlock()
	if run && s.onEnd != nil {
		s.onEnd()
	}
}

// state returns what the close logic needs to know.
func (s *h2stream) state() (readEOF, writeClosed, reset bool) {
	s.rmu.Lock()
	readEOF = s.rEOF && len(s.rq) == 0
	s.rmu.Unlock()
	s.c.mu.Lock()
	writeClosed, reset = s.wClosed, s.resetDone
	s.c.mu.Unlock()
	return
}

// --- client response ---

func (s *h2stream) respDone() bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.respReady
}

func (s *h2stream) setResponse(code int, h http.Header) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.respReady {
		return
	}
	s.respReady, s.status, s.header = true, code, h
	close(s.respc)
}

func (s *h2stream) String() string { return fmt.Sprintf("stream %d", s.id) }
