package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
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
func pipe(down, up net.Conn, counts *counters) error {
	errc := make(chan error, 1)
	pipeThen(down, up, counts, func(err error) { errc <- err })
	return <-errc
}

// pipeThen is pipe calling then with its result instead of returning it,
// possibly from another goroutine.
//
// With an HBONE stream on either side, the stream → socket direction runs
// without a goroutine (StartCopyTo), and the socket → stream direction
// pauses once the socket has been quiet for restAfter and goes on from a
// fresh goroutine (copyResting): an idle proxied connection costs one
// parked goroutine with a small stack.
func pipeThen(down, up net.Conn, counts *counters, then func(error)) {
	errc := make(chan error, 1)
	// end waits for the other direction once this one ended with err.
	end := func(err error) error {
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
	// done ends the goroutine-less direction. It runs on the stream's
	// connection reader, which must not block: a failure aborts both ends
	// (unblocking the other copy) from a goroutine of its own.
	done := func(dst net.Conn) func(error) {
		return func(err error) {
			if err = finish(dst, err); err != nil {
				go abort(down, up)
			}
			errc <- err
		}
	}
	if s, ok := down.(streamCopier); ok {
		s.StartCopyTo(up, &counts.received, done(up))
		copyResting(down, s, up, &counts.sent, func(err error) { then(end(err)) })
		return
	}
	if s, ok := up.(streamCopier); ok {
		s.StartCopyTo(down, &counts.sent, done(down))
		copyResting(up, s, down, &counts.received, func(err error) { then(end(err)) })
		return
	}
	go func() {
		err := copyDir(up, down, &counts.received)
		if err != nil {
			// The other direction may be blocked reading a silent
			// peer: unblock it.
			abort(down, up)
		}
		errc <- err
	}()
	then(end(copyDir(down, up, &counts.sent)))
}

// restAfter is how long a socket feeding an HBONE stream stays quiet,
// after moving data, before its copy goes on from a fresh goroutine
// (hbone's CopyFromResting says why). Short enough that a connection left
// idle soon parks on a small stack; long enough that a busy connection
// pays one timer a period, not one per read. A var for tests.
var restAfter = time.Second

// copyResting copies src into the stream dst (s) and half-closes it at EOF,
// like copyDir, then calls then with the result. When src goes quiet it
// goes on from a fresh goroutine and the calling one returns.
func copyResting(dst net.Conn, s streamCopier, src net.Conn, n *atomic.Int64, then func(error)) {
	_, err := s.CopyFromResting(src, n, restAfter)
	if errors.Is(err, hbone.ErrRest) {
		rests.Add(1)
		go copyResting(dst, s, src, n, then)
		return
	}
	then(finish(dst, err))
}

// rests counts copies moved to a fresh goroutine (tests read it).
var rests atomic.Int64

// relay runs pipe(down, up) and then cleanup(pipe's error) on a goroutine
// of its own, so that the connection's handler returns once set-up is done:
// set-up (state lookups, policy, the CONNECT, logging) grows the handler's
// stack, and an idle connection would keep that stack for its whole life
// parked in pipe, where a new goroutine parks with a small one (measured
// in-process: 4.1 KB less stack per idle outbound connection). A drain
// waits for cleanup as it waits for a handler.
func (p *Proxy) relay(down, up net.Conn, counts *counters, cleanup func(error)) {
	end := p.conns.begin()
	go pipeThen(down, up, counts, func(err error) {
		defer end()
		cleanup(err)
	})
}

// streamCopier is an HBONE stream (hbone.Stream, hbone.ServerStream): it
// moves bytes to and from a socket itself, without this package's
// buffers, and with no goroutine of its own while the connection is idle.
type streamCopier interface {
	CopyFrom(src io.Reader, n *atomic.Int64) (int64, error)
	CopyFromResting(src io.Reader, n *atomic.Int64, rest time.Duration) (int64, error)
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
