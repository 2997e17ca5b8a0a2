package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
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
	w        http.ResponseWriter
	r        *http.Request
	conn     *serverConn
	answered atomic.Bool
	stream   *ServerStream // set by Accept, before it returns
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
	h := r.w.Header()
	for k, v := range hdr {
		h[k] = v
	}
	r.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(r.w)
	// Send the 200 now rather than with the first DATA.
	if err := rc.Flush(); err != nil {
		return nil, fmt.Errorf("hbone: accept %s: %w", r.Authority, err)
	}
	s := &ServerStream{req: r, w: r.w, rc: rc, body: r.r.Body}
	r.stream = s
	return s, nil
}

// Reject answers with status code (≥ 300; upstream uses 401 for denied
// by policy, 503 for upstream dial failures, 400 for bad requests) and
// counts it under reason. reason becomes a metric label value: use a small
// fixed set of constants. The response is sent when the Handler returns.
func (r *Request) Reject(code int, reason string) error {
	if code < 300 || code > 599 {
		return fmt.Errorf("hbone: reject %s: status %d is not an error", r.Authority, code)
	}
	if !r.answered.CompareAndSwap(false, true) {
		return fmt.Errorf("hbone: reject %s: request already answered", r.Authority)
	}
	r.s.metrics.reject(reason)
	r.s.log.Debug("hbone: request rejected", "authority", r.Authority.String(), "remote", r.RemoteAddr.String(), "status", code, "reason", reason)
	r.w.WriteHeader(code)
	return nil
}

// finish runs when the Handler returns, before x/net ends the stream.
func (r *Request) finish() {
	if !r.answered.Load() {
		_ = r.Reject(http.StatusInternalServerError, ReasonUnanswered)
	}
	if r.stream != nil {
		r.stream.finish()
	}
}

// pastDeadline makes x/net reset the stream at once (RST_STREAM).
var pastDeadline = time.Unix(1, 0)

// ServerStream is an accepted CONNECT stream, valid until the Handler
// returns. It implements net.Conn plus CloseWrite, Reset and SetLinger.
// Read and Write may be called from different goroutines.
type ServerStream struct {
	// Immutable after Accept.
	req  *Request
	w    http.ResponseWriter
	rc   *http.ResponseController
	body io.ReadCloser

	readStopped atomic.Bool // we stopped reading (CloseWrite, Close)
	writeClosed atomic.Bool
	linger0     atomic.Bool
	closed      atomic.Bool

	mu       sync.Mutex
	ops      int           // guarded by mu: Read/Write/... calls in progress
	finished bool          // guarded by mu: the Handler returned
	drained  chan struct{} // guarded by mu: closed when ops reaches 0 after finish
}

// enter guards w and body against use after the Handler returned, when
// x/net would panic.
func (s *ServerStream) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return false
	}
	s.ops++
	return true
}

func (s *ServerStream) exit() {
	s.mu.Lock()
	s.ops--
	if s.ops == 0 && s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
	s.mu.Unlock()
}

// finish runs on the Handler's goroutine as it returns: a Read or Write
// still running on another goroutine is unblocked (stream reset) and
// waited for.
func (s *ServerStream) finish() {
	s.mu.Lock()
	s.finished = true
	var wait chan struct{}
	if s.ops > 0 {
		wait = make(chan struct{})
		s.drained = wait
	}
	s.mu.Unlock()
	if wait != nil {
		_ = s.rc.SetWriteDeadline(pastDeadline)
		_ = s.body.Close()
		<-wait
	}
}

// Read reads bytes the client sent; io.EOF when the client ended its side
// or after CloseWrite/Close stopped reading.
func (s *ServerStream) Read(p []byte) (int, error) {
	if !s.enter() {
		return 0, net.ErrClosed
	}
	defer s.exit()
	if s.readStopped.Load() {
		return 0, io.EOF
	}
	n, err := s.body.Read(p)
	if err != nil && err != io.EOF && s.readStopped.Load() {
		err = io.EOF
	}
	return n, err
}

// Write sends p to the client and flushes it.
func (s *ServerStream) Write(p []byte) (int, error) {
	if s.writeClosed.Load() || !s.enter() {
		return 0, net.ErrClosed
	}
	defer s.exit()
	n, err := s.w.Write(p)
	if err == nil {
		err = s.rc.Flush()
	}
	return n, err
}

// CloseWrite ends the server → client direction. x/net sends END_STREAM
// only when the Handler returns, and cannot keep reading after that, so
// CloseWrite also stops reading: later Reads return io.EOF and the client's
// remaining bytes are dropped (see the package doc). A client waiting for
// EOF therefore gets it as soon as the Handler returns.
func (s *ServerStream) CloseWrite() error {
	if s.writeClosed.Swap(true) || !s.enter() {
		return nil
	}
	defer s.exit()
	err := s.rc.Flush()
	s.stopReading()
	return err
}

func (s *ServerStream) stopReading() {
	if !s.readStopped.Swap(true) {
		_ = s.body.Close()
	}
}

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

// Close ends the stream gracefully, as closing a TCP socket sends FIN: it
// flushes, stops reading, and END_STREAM follows when the Handler returns;
// the client reads everything written and then EOF. After SetLinger(0) it
// resets instead (see Reset). Close is safe to call more than once.
func (s *ServerStream) Close() error {
	if s.closed.Swap(true) || !s.enter() {
		return nil
	}
	defer s.exit()
	s.writeClosed.Store(true)
	if s.linger0.Load() {
		_ = s.rc.SetWriteDeadline(pastDeadline)
		s.stopReading()
		return nil
	}
	err := s.rc.Flush()
	s.stopReading()
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
func (s *ServerStream) LocalAddr() net.Addr {
	if s.req.conn == nil {
		return nil
	}
	return s.req.conn.raw.LocalAddr()
}

// RemoteAddr is the client end of the HBONE TCP connection.
func (s *ServerStream) RemoteAddr() net.Addr {
	if s.req.conn == nil {
		return nil
	}
	return s.req.conn.raw.RemoteAddr()
}

// SetDeadline is not supported: x/net/http2 deadlines end the stream.
func (s *ServerStream) SetDeadline(time.Time) error { return errUnsupported }

// SetReadDeadline is not supported; see SetDeadline.
func (s *ServerStream) SetReadDeadline(time.Time) error { return errUnsupported }

// SetWriteDeadline is not supported; see SetDeadline.
func (s *ServerStream) SetWriteDeadline(time.Time) error { return errUnsupported }

var _ net.Conn = (*ServerStream)(nil)
