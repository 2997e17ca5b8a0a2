package hbone

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// Stream is an established client CONNECT stream: the bytes of one
// proxied TCP connection. It implements net.Conn plus CloseWrite (END_STREAM,
// keep reading), Reset and SetLinger, and io.ReaderFrom/io.WriterTo (CopyFrom,
// CopyTo) for copying without intermediate buffers. Read and Write may be
// called from different goroutines; Close must be called once done.
type Stream struct {
	*h2stream
	// Immutable after Connect.
	pool   *Pool
	conn   *poolConn
	header http.Header

	linger0   atomic.Bool
	closed    atomic.Bool
	closeOnce sync.Once
}

// Read reads bytes the server sent. It returns io.EOF when the server
// ended its side (END_STREAM) and an error if the stream was reset.
func (s *Stream) Read(p []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	return s.read(p)
}

// Write sends p as DATA. It returns once the connection took all of p.
func (s *Stream) Write(p []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	return s.write(p)
}

// ReadFrom sends what r yields until EOF; see CopyFrom.
func (s *Stream) ReadFrom(r io.Reader) (int64, error) { return s.CopyFrom(r, nil) }

// WriteTo writes what the server sends to w until END_STREAM; see CopyTo.
func (s *Stream) WriteTo(w io.Writer) (int64, error) { return s.CopyTo(w, nil) }

// CloseWrite ends the client → server direction (END_STREAM) while the
// server's bytes can still be read.
func (s *Stream) CloseWrite() error { return s.closeWrite() }

// SetLinger(0) makes the next Close reset the stream, like SetLinger(0)
// on a TCP socket; other values restore the default.
func (s *Stream) SetLinger(sec int) error {
	s.linger0.Store(sec == 0)
	return nil
}

// Reset aborts the stream in both directions (RST_STREAM CANCEL) and
// releases it; the peer sees an error, not EOF.
func (s *Stream) Reset() error {
	s.linger0.Store(true)
	return s.Close()
}

// Close releases the stream. If the server's side was read to EOF it is a
// graceful close (END_STREAM on our side if not yet sent); otherwise — or
// after SetLinger(0) — the stream is reset, as closing a TCP socket with
// unread data does. Close is safe to call more than once.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		readEOF, _, _ := s.state()
		if readEOF && !s.linger0.Load() {
			_ = s.closeWrite()
		} else {
			s.resetWith(http2.ErrCodeCancel, false, net.ErrClosed)
		}
		s.c.removeStream(s.h2stream)
		s.pool.release(s.conn)
	})
	return nil
}

// Header returns the headers of the server's 200 response (e.g. baggage).
func (s *Stream) Header() http.Header { return s.header }

// ConnectionState returns the TLS state of the HBONE connection carrying
// the stream: peer certificates, negotiated protocol.
func (s *Stream) ConnectionState() tls.ConnectionState { return *s.conn.tls }

// Key returns the pool key of the connection carrying the stream.
func (s *Stream) Key() Key { return s.conn.key }

// LocalAddr is the local address of the HBONE TCP connection.
func (s *Stream) LocalAddr() net.Addr { return s.conn.local }

// RemoteAddr is the peer address of the HBONE TCP connection (its 15008).
func (s *Stream) RemoteAddr() net.Addr { return s.conn.remote }

// SetDeadline is not supported: a stream has no per-call timeouts.
func (s *Stream) SetDeadline(time.Time) error { return errUnsupported }

// SetReadDeadline is not supported; see SetDeadline.
func (s *Stream) SetReadDeadline(time.Time) error { return errUnsupported }

// SetWriteDeadline is not supported; see SetDeadline.
func (s *Stream) SetWriteDeadline(time.Time) error { return errUnsupported }

var _ net.Conn = (*Stream)(nil)
