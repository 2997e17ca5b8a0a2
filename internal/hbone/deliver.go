package hbone

import (
	"errors"
	"io"
	"sync/atomic"
)

// Delivery of a stream's received bytes to a sink (the proxy's socket):
// CopyTo with a goroutine of its own, StartCopyTo without one. The
// connection's reader writes straight into the sink (h2stream.onData)
// whenever that does not block; what would block is queued and written
// by the sink's writer.

// CopyTo writes what the peer sends to dst until END_STREAM (nil) or an
// error, counting bytes into n (may be nil) as they move. While it runs,
// the connection's reader writes into dst itself whenever dst is a socket
// that can take the bytes without blocking; this goroutine only writes
// what would have blocked, and otherwise sleeps without a buffer. It does
// not close dst.
func (s *h2stream) CopyTo(dst io.Writer, n *atomic.Int64) (int64, error) {
	k := newSink(dst, n)
	s.rmu.Lock()
	if s.sink != nil {
		s.rmu.Unlock()
		return 0, errConcurrentCopy
	}
	s.sink = k
	for {
		if s.writeQueuedLocked(k) {
			continue
		}
		s.sinkBusy = false
		if s.sinkErr != nil || s.rErr != nil || s.rEOF || s.rStop {
			err := s.sinkErr
			if err == nil {
				err = s.rErr
			}
			s.sink = nil
			s.rmu.Unlock()
			return k.total.Load(), err
		}
		s.rmu.Unlock()
		<-s.signal
		s.rmu.Lock()
	}
}

var errConcurrentCopy = errors.New("hbone: concurrent CopyTo on one stream")

// StartCopyTo is CopyTo without a goroutine of its own: it returns at
// once, the connection's reader delivers into dst, a goroutine exists only
// while dst is full, and done runs once — with nil after END_STREAM, or the
// error — on whichever goroutine finished. done must not block. An idle
// proxied connection then costs no goroutine in this direction.
func (s *h2stream) StartCopyTo(dst io.Writer, n *atomic.Int64, done func(error)) {
	k := newSink(dst, n)
	k.done = done
	s.rmu.Lock()
	if s.sink != nil {
		s.rmu.Unlock()
		done(errConcurrentCopy)
		return
	}
	s.sink = k
	if len(s.rq) > 0 {
		s.startDrainLocked()
		s.rmu.Unlock()
		return
	}
	fn, err := s.takeDoneLocked()
	s.rmu.Unlock()
	if fn != nil {
		fn(err)
	}
}

// drain is StartCopyTo's writer for bytes that would have blocked.
func (s *h2stream) drain(k *sink) {
	s.rmu.Lock()
	for s.writeQueuedLocked(k) {
	}
	s.sinkBusy = false
	done, err := s.takeDoneLocked()
	s.rmu.Unlock()
	if done != nil {
		done(err)
	}
}

// writeQueuedLocked writes the first queued chunk to k, waiting if the
// socket is full (rmu is released meanwhile), and reports whether it did.
// A failed sink drops the queue and stops reading.
func (s *h2stream) writeQueuedLocked(k *sink) bool {
	if s.sinkErr != nil || len(s.rq) == 0 {
		if s.sinkErr != nil && len(s.rq) > 0 {
			dropped := s.dropQueueLocked()
			s.rmu.Unlock()
			s.c.credit(nil, 0, dropped, false)
			s.rmu.Lock()
		}
		return false
	}
	s.sinkBusy = true
	ch := s.rq[0]
	s.rq[0] = chunk{}
	s.rq = s.rq[1:]
	s.rmu.Unlock()
	w, err := k.write(ch.b)
	putBuf(ch.buf)
	k.count(w)
	if err == nil && w < len(ch.b) {
		err = io.ErrShortWrite
	}
	var inc uint32
	s.rmu.Lock()
	if err != nil {
		s.sinkErr, s.rStop = err, true
	} else {
		inc = s.streamCreditLocked(int64(w))
	}
	s.rmu.Unlock()
	s.c.credit(s, inc, int64(len(ch.b)), false)
	s.rmu.Lock()
	return true
}

// startDrainLocked hands queued bytes to the sink's writer: the goroutine
// in CopyTo, or for StartCopyTo a goroutine started now that lives until
// the queue is empty.
func (s *h2stream) startDrainLocked() {
	s.sinkBusy = true
	if s.sink.done == nil {
		s.notify()
		return
	}
	go s.drain(s.sink)
}

// takeDoneLocked detaches a StartCopyTo sink that has finished (END_STREAM
// delivered, reset, or the sink failed) and returns its done callback and
// result, for the caller to run once rmu is released.
func (s *h2stream) takeDoneLocked() (func(error), error) {
	k := s.sink
	if k == nil || k.done == nil || s.sinkBusy || len(s.rq) > 0 {
		return nil, nil
	}
	var err error
	switch {
	case s.sinkErr != nil:
		err = s.sinkErr
	case s.rErr != nil:
		err = s.rErr
	case s.rEOF || s.rStop:
	default:
		return nil, nil
	}
	s.sink = nil
	return k.done, err
}
