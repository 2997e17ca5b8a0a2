package hbone

import (
	"errors"
	"fmt"
	"net/http"
)

// Rejection and failure reasons. Each is used both in the error text and
// as the value of a metric label, so the label set stays small and fixed.
const (
	// Server, per stream.
	ReasonMethodNotAllowed = "method_not_allowed" // not CONNECT → 405
	ReasonBadAuthority     = "bad_authority"      // :authority not ip:port → 400
	ReasonUnanswered       = "unanswered"         // Handler returned without Accept/Reject → 500
	ReasonHeadersTooLarge  = "headers_too_large"  // header block over the server's limit → 431

	// Server, per connection.
	ReasonTLSHandshake = "tls_handshake" // handshake failed: no/invalid client cert, plaintext, timeout
	ReasonTLSVersion   = "tls_version"   // negotiated below TLS 1.3, or ALPN other than h2
	ReasonConnRejected = "conn_rejected" // ServerOptions.ConnContext returned an error
	ReasonBadPreface   = "bad_preface"   // not an HTTP/2 client preface after TLS

	// Pool, per new connection (ztunnel_hbone_pool_dials_total{result}).
	resultOK        = "ok"
	ReasonDial      = "dial"       // TCP connect failed
	ReasonTLSConfig = "tls_config" // PoolOptions.TLS returned an error
	ReasonHTTP2     = "http2"      // HTTP/2 client connection setup failed
)

// ErrPoolClosed is returned by Pool.Connect after Close or Shutdown.
var ErrPoolClosed = errors.New("hbone: pool closed")

// ErrServerClosed is returned by Serve and ServeConn after Shutdown or
// Close.
var ErrServerClosed = errors.New("hbone: server closed")

// errUnsupported is returned by the deadline methods of streams, which
// have no per-call timeouts.
var errUnsupported = fmt.Errorf("hbone: stream deadlines: %w", errors.ErrUnsupported)

// StatusError is returned by Pool.Connect when the server answered the
// CONNECT with a status other than 200 (upstream: 401 denied by policy,
// 503 upstream dial failed, 400 bad request).
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("hbone: CONNECT rejected: %d %s", e.Code, http.StatusText(e.Code))
}

// ConnectError is returned by Pool.Connect when a new HBONE connection
// could not be set up; Reason is one of ReasonDial, ReasonTLSConfig,
// ReasonTLSHandshake, ReasonTLSVersion, ReasonHTTP2.
type ConnectError struct {
	Reason string
	Addr   string
	Err    error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("hbone: connect %s: %s: %v", e.Addr, e.Reason, e.Err)
}

func (e *ConnectError) Unwrap() error { return e.Err }
