package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Buffer sizes for copying between a TCP socket and an HBONE stream. An idle
// or chatty connection holds only a small buffer per direction; a direction
// whose reads keep filling the buffer is moved to a large one, which is what
// bulk transfers need to amortise per-write costs over TLS and HTTP/2.
const (
	smallBuf = 4 << 10
	largeBuf = 256 << 10
	// fullReadsToGrow is how many consecutive full reads mark a direction as
	// bulk; one full read happens to chatty protocols too.
	fullReadsToGrow = 4
)

var (
	smallPool = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}
	largePool = sync.Pool{New: func() any { b := make([]byte, largeBuf); return &b }}
)

// closeWriter is a connection that can end its write side while still
// reading (TCP FIN, HTTP/2 END_STREAM).
type closeWriter interface {
	CloseWrite() error
}

// pipe copies down→up and up→down until both directions end. A clean EOF in
// one direction is passed on as a half-close, so protocols that shut down
// their write side first keep working. An error in either direction (reset,
// timeout, closed by a drain) aborts both. counts is updated as bytes move
// so a live connection's totals can be read while it runs.
//
// With an HBONE stream on either side, the stream → socket direction runs
// without a goroutine (StartCopyTo), so an idle proxied connection costs
// one parked goroutine, this one (started by relay, so its stack is small).
func pipe(down, up net.Conn, counts *counters) error {
	errc := make(chan error, 1)
	// done ends the goroutine-less direction. It runs on the stream's
	// connection reader, which must not block: a failure aborts both ends
	// (unblocking this goroutine's copy) from a goroutine of its own.
	done := func(dst net.Conn) func(error) {
		return func(err error) {
			if err = finish(dst, err); err != nil {
				go abort(down, up)
			}
			errc <- err
		}
	}
	var err error
	if s, ok := down.(streamCopier); ok {
		s.StartCopyTo(up, &counts.received, done(up))
		err = copyDir(down, up, &counts.sent)
	} else if s, ok := up.(streamCopier); ok {
		s.StartCopyTo(down, &counts.sent, done(down))
		err = copyDir(up, down, &counts.received)
	} else {
		go func() {
			err := copyDir(up, down, &counts.received)
			if err != nil {
				// The other direction may be blocked reading a silent
				// peer: unblock it.
				abort(down, up)
			}
			errc <- err
		}()
		err = copyDir(down, up, &counts.sent)
	}
	if err != nil {
		// Unblock the other direction at once.
		abort(down, up)
		<-errc
		return err
	}
	if err2 := <-errc; err2 != nil {
		abort(down, up)
		return err2
	}
	return nil
}

// relay runs pipe(down, up) and then cleanup(pipe's error) on a goroutine
// of its own, so that the connection's handler returns once set-up is done:
// set-up (state lookups, policy, the CONNECT, logging) grows the handler's
// stack, and an idle connection would keep that stack for its whole life
// parked in pipe, where a new goroutine parks with a small one (measured
// in-process: 4.1 KB less stack per idle outbound connection). A drain
// waits for cleanup as it waits for a handler.
//
// cleanup runs on a kept worker (Options.Workers), not on the copying
// goroutine: the access log it writes goes deep (slog's handler chain)
// and grew the copying goroutine's small stack on nearly every
// connection, a copy of the whole stack each time (uprobes on
// runtime.morestack in the bench's connection loop: one per connection
// on each node, under record.done), where a worker's stack stays grown.
func (p *Proxy) relay(down, up net.Conn, counts *counters, cleanup func(error)) {
	end := p.conns.begin()
	go func() {
		err := pipe(down, up, counts)
		p.opts.Workers.Go(func() {
			defer end()
			cleanup(err)
		})
	}()
}

// streamCopier is an HBONE stream (hbone.Stream, hbone.ServerStream): it
// moves bytes to and from a socket itself, without this package's
// buffers, and with no goroutine of its own while the connection is idle.
type streamCopier interface {
	CopyFrom(src io.Reader, n *atomic.Int64) (int64, error)
	CopyTo(dst io.Writer, n *atomic.Int64) (int64, error)
	StartCopyTo(dst io.Writer, n *atomic.Int64, done func(error))
}

// copyDir copies src → dst and half-closes dst at EOF.
func copyDir(dst, src net.Conn, n *atomic.Int64) error {
	if s, ok := dst.(streamCopier); ok {
		_, err := s.CopyFrom(src, n)
		return finish(dst, err)
	}
	if s, ok := src.(streamCopier); ok {
		_, err := s.CopyTo(dst, n)
		return finish(dst, err)
	}
	if dt, ok := dst.(*net.TCPConn); ok {
		if st, ok := src.(*net.TCPConn); ok {
			// TCP to TCP: splice in the kernel (splice.go).
			return finish(dst, spliceCopy(dt, st, n))
		}
	}
	return finish(dst, copyBuffered(dst, src, n))
}

func finish(dst net.Conn, err error) error {
	if err != nil {
		return err
	}
	if cw, ok := dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !isClosed(err) {
			return err
		}
	}
	return nil
}

func copyBuffered(dst io.Writer, src io.Reader, n *atomic.Int64) error {
	bp := smallPool.Get().(*[]byte)
	large := false
	defer func() {
		if large {
			largePool.Put(bp)
		} else {
			smallPool.Put(bp)
		}
	}()
	full := 0
	for {
		buf := *bp
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n.Add(int64(nw))
			if werr != nil {
				return werr
			}
			if nw != nr {
				return io.ErrShortWrite
			}
			if nr == len(buf) && !large {
				if full++; full >= fullReadsToGrow {
					smallPool.Put(bp)
					bp = largePool.Get().(*[]byte)
					large = true
				}
			} else {
				full = 0
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return nil
			}
			return rerr
		}
	}
}

// abort closes both ends; a TCP end is reset (linger 0) so the peer learns
// the connection failed rather than seeing a clean close.
func abort(conns ...net.Conn) {
	for _, c := range conns {
		if t, ok := c.(interface{ SetLinger(int) error }); ok {
			t.SetLinger(0)
		}
		c.Close()
	}
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ENOTCONN) || errors.Is(err, io.ErrClosedPipe)
}
