package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// errStreamReset is what the transport sees when a Stream is closed
// abortively; it makes x/net reset the stream (RST_STREAM CANCEL).
var errStreamReset = errors.New("hbone: stream reset")

// Stream is an established client CONNECT stream: the bytes of one
// proxied TCP connection. It implements net.Conn plus CloseWrite (END_STREAM,
// keep reading), Reset and SetLinger. Read and Write may be called from
// different goroutines; Close must be called once done.
//
// Writes go through an io.Pipe to the x/net goroutine that already exists
// per request; no goroutine is added per stream or per direction.
type Stream struct {
	// Immutable after Connect.
	pool   *Pool
	conn   *poolConn
	body   io.ReadCloser  // response body: server → client bytes
	pw     *io.PipeWriter // request body: client → server bytes
	cancel context.CancelFunc
	header http.Header

	readEOF     atomic.Bool
	writeClosed atomic.Bool
	linger0     atomic.Bool
	closed      atomic.Bool
	closeOnce   sync.Once
}

// Read reads bytes the server sent. It returns io.EOF when the server
// ended its side (END_STREAM) and an error if the stream was reset.
func (s *Stream) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	if err != nil {
		if err == io.EOF {
			s.readEOF.Store(true)
		} else if s.closed.Load() {
			err = net.ErrClosed
		}
	}
	return n, err
}

// Write sends p as DATA. It returns once the transport took all of p,
// which is flushed to the connection without delay.
func (s *Stream) Write(p []byte) (int, error) {
	n, err := s.pw.Write(p)
	if err != nil && (s.closed.Load() || s.writeClosed.Load()) {
		err = net.ErrClosed
	}
	return n, err
}

// CloseWrite ends the client → server direction (END_STREAM) while the
// server's bytes can still be read.
func (s *Stream) CloseWrite() error {
	s.writeClosed.Store(true)
	return s.pw.Close()
}

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
		if s.readEOF.Load() && !s.linger0.Load() {
			// Both sides end cleanly; x/net finishes the stream itself
			// once END_STREAM is written. Closing the body or the context
			// now would reset it instead.
			_ = s.pw.Close()
		} else {
			_ = s.pw.CloseWithError(errStreamReset)
			_ = s.body.Close()
			s.cancel()
		}
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

// SetDeadline is not supported: x/net/http2 cannot time out one call on a
// stream without ending the stream.
func (s *Stream) SetDeadline(time.Time) error { return errUnsupported }

// SetReadDeadline is not supported; see SetDeadline.
func (s *Stream) SetReadDeadline(time.Time) error { return errUnsupported }

// SetWriteDeadline is not supported; see SetDeadline.
func (s *Stream) SetWriteDeadline(time.Time) error { return errUnsupported }

var _ net.Conn = (*Stream)(nil)
