package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Request is one CONNECT stream offered to ServerOptions.Handler. The
// Handler answers it exactly once, with Accept or Reject.
type Request struct {
	// Authority is the :authority, the destination the client asks for.
	Authority netip.AddrPort
	// Header holds the request headers (baggage, forwarded, traceparent,
	// ...). Read-only.
	Header http.Header
	// TLS is the connection's TLS state; TLS.PeerCertificates[0] is the
	// client's leaf (its SPIFFE id is in the URI SAN). Shared by all
	// streams of the connection: read-only.
	TLS *tls.ConnectionState
	// RemoteAddr is the TCP peer (the client ztunnel or waypoint).
	RemoteAddr netip.AddrPort
	// LocalAddr is our end of the TCP connection: with a transparent
	// listener, the address the client dialed.
	LocalAddr netip.AddrPort

	s        *Server
	st       *h2stream
	conn     *serverConn
	answered atomic.Bool
	stream   *ServerStream // set by Accept, before it returns

	// end finishes the request (serveStream); detached: the Handler called
	// Detach, so returning does not run end. Both belong to the Handler's
	// goroutine until it returns.
	end      func()
	detached bool
}

// Detach lets the Handler return while the accepted stream lives on, so
// that the stream's copy can continue on a goroutine with a smaller stack
// than the one that set it up. Everything the Handler's return would do
// (end the stream if still open, cancel the Handler's context, release
// Shutdown's wait for handlers) happens when finish is called instead;
// finish must be called exactly once (later calls do nothing), after the
// last use of the stream. Detach may only be called by the Handler.
func (r *Request) Detach() (finish func()) {
	r.detached = true
	var once sync.Once
	return func() { once.Do(r.end) }
}

// PeerCertificates returns the client's certificate chain, leaf first.
func (r *Request) PeerCertificates() []*x509.Certificate {
	if r.TLS == nil {
		return nil
	}
	return r.TLS.PeerCertificates
}

// Accept answers 200 with the extra headers hdr (e.g. baggage; may be nil)
// and returns the stream. Call it only after the upstream connection and
// authorization succeeded: the 200 tells the client the tunnel is up.
func (r *Request) Accept(hdr http.Header) (*ServerStream, error) {
	if !r.answered.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("hbone: accept %s: request already answered", r.Authority)
	}
	if err := r.respond(http.StatusOK, hdr, false); err != nil {
		return nil, fmt.Errorf("hbone: accept %s: %w", r.Authority, err)
	}
	s := &ServerStream{h2stream: r.st, req: r}
	r.stream = s
	return s, nil
}

// Reject answers with status code (≥ 300; upstream uses 401 for denied
// by policy, 503 for upstream dial failures, 400 for bad requests) and
// counts it under reason. reason becomes a metric label value: use a small
// fixed set of constants.
func (r *Request) Reject(code int, reason string) error {
	if code < 300 || code > 599 {
		return fmt.Errorf("hbone: reject %s: status %d is not an error", r.Authority, code)
	}
	if !r.answered.CompareAndSwap(false, true) {
		return fmt.Errorf("hbone: reject %s: request already answered", r.Authority)
	}
	r.s.metrics.reject(reason)
	r.s.log.Debug("hbone: request rejected", "authority", r.Authority.String(), "remote", r.RemoteAddr.String(), "status", code, "reason", reason)
	return r.respond(code, nil, true)
}

// respond sends the response HEADERS; end ends our side with them.
func (r *Request) respond(code int, hdr http.Header, end bool) error {
	st := r.st
	c := st.c
	c.mu.Lock()
	if st.wClosed || st.sendErr != nil {
		err := st.sendErr
		c.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return err
	}
	if end {
		st.wClosed = true
	}
	c.mu.Unlock()
	f := make([]hpack.HeaderField, 0, 1+len(hdr))
	f = append(f, hpack.HeaderField{Name: ":status", Value: strconv.Itoa(code)})
	f = appendHeader(f, hdr)
	return c.writeControl(false, func() { c.writeHeadersLocked(st.id, end, f) })
}

// finish runs when the Handler returns: an unanswered request gets 500,
// and a stream not ended on both sides is ended: END_STREAM for our side,
// then RST_STREAM NO_ERROR if the client is still sending.
func (r *Request) finish() {
	if !r.answered.Load() {
		_ = r.Reject(http.StatusInternalServerError, ReasonUnanswered)
	}
	if r.stream != nil {
		r.stream.closed.Store(true)
	}
	st := r.st
	readEOF, writeClosed, reset := st.state()
	if !reset {
		if !writeClosed {
			_ = st.closeWrite()
		}
		if !readEOF {
			st.resetWith(http2.ErrCodeNo, false, net.ErrClosed)
		}
	}
	st.c.removeStream(st)
	st.end()
}

// ServerStream is an accepted CONNECT stream, valid until the Handler
// returns (after Detach: until finish is called). It implements net.Conn
// plus CloseWrite, Reset and SetLinger, and io.ReaderFrom/io.WriterTo
// (CopyFrom, CopyTo). Read and Write may be
// called from different goroutines.
type ServerStream struct {
	*h2stream
	// Immutable after Accept.
	req *Request

	linger0 atomic.Bool
	closed  atomic.Bool // Close ran, or the Handler returned
}

// Read reads bytes the client sent; io.EOF when the client ended its side.
func (s *ServerStream) Read(p []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	return s.read(p)
}

// Write sends p to the client.
func (s *ServerStream) Write(p []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	return s.write(p)
}

// ReadFrom sends what r yields until EOF; see CopyFrom.
func (s *ServerStream) ReadFrom(r io.Reader) (int64, error) { return s.CopyFrom(r, nil) }

// WriteTo writes what the client sends to w until END_STREAM; see CopyTo.
func (s *ServerStream) WriteTo(w io.Writer) (int64, error) { return s.CopyTo(w, nil) }

// CloseWrite ends the server → client direction (END_STREAM); the
// client's bytes can still be read.
func (s *ServerStream) CloseWrite() error { return s.closeWrite() }

// SetLinger(0) makes the next Close reset the stream, like SetLinger(0)
// on a TCP socket; other values restore the default.
func (s *ServerStream) SetLinger(sec int) error {
	s.linger0.Store(sec == 0)
	return nil
}

// Reset aborts the stream (RST_STREAM): the client sees an error, not EOF.
func (s *ServerStream) Reset() error {
	s.linger0.Store(true)
	return s.Close()
}

// Close ends the stream gracefully, as closing a TCP socket sends FIN: the
// client reads everything written and then EOF; if the client was still
// sending, the stream is then reset with NO_ERROR so it stops. After
// SetLinger(0) it resets instead (see Reset). Close is safe to call more
// than once.
func (s *ServerStream) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.linger0.Load() {
		s.resetWith(http2.ErrCodeCancel, false, net.ErrClosed)
		return nil
	}
	err := s.closeWrite()
	if readEOF, _, reset := s.state(); !readEOF && !reset {
		s.resetWith(http2.ErrCodeNo, false, net.ErrClosed)
	}
	return err
}

// Request returns the Request this stream answered.
func (s *ServerStream) Request() *Request { return s.req }

// ConnectionState returns the TLS state of the HBONE connection.
func (s *ServerStream) ConnectionState() tls.ConnectionState {
	if s.req.TLS == nil {
		return tls.ConnectionState{}
	}
	return *s.req.TLS
}

// LocalAddr is our end of the HBONE TCP connection.
func (s *ServerStream) LocalAddr() net.Addr { return s.req.conn.raw.LocalAddr() }

// RemoteAddr is the client end of the HBONE TCP connection.
func (s *ServerStream) RemoteAddr() net.Addr { return s.req.conn.raw.RemoteAddr() }

// SetDeadline is not supported: a stream has no per-call timeouts.
func (s *ServerStream) SetDeadline(time.Time) error { return errUnsupported }

// SetReadDeadline is not supported; see SetDeadline.
func (s *ServerStream) SetReadDeadline(time.Time) error { return errUnsupported }

// SetWriteDeadline is not supported; see SetDeadline.
func (s *ServerStream) SetWriteDeadline(time.Time) error { return errUnsupported }

var _ net.Conn = (*ServerStream)(nil)
