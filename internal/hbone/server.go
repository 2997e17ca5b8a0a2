package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/internal/workers"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// TLS is the server config: our certificate, and a client-certificate
	// requirement that verifies the peer (e.g. RequireAnyClientCert plus
	// VerifyPeerCertificate checking the SPIFFE chain). Required. The
	// server adds ALPN "h2" and MinVersion TLS 1.3 if missing.
	TLS *tls.Config
	// Handler is called once per valid CONNECT stream, on a goroutine of
	// its own (see Workers); it must Accept or Reject the Request, and the
	// stream lives until Handler returns (or, after Request.Detach, until
	// the function Detach returned is called). ctx is cancelled when the
	// stream or the connection ends; Handler must return promptly after
	// that. Required.
	Handler func(ctx context.Context, req *Request)
	// ConnContext, if set, runs once per connection after the TLS
	// handshake: it can derive the peer identity once and store it in the
	// returned context (Handler's ctx descends from it), or return an error
	// to close the connection. May be nil.
	ConnContext func(ctx context.Context, cs *tls.ConnectionState) (context.Context, error)
	// MaxConcurrentStreams is advertised in SETTINGS; 0 means
	// DefaultServerMaxConcurrentStreams.
	MaxConcurrentStreams int
	// Workers, if set, runs Handler calls on goroutines kept between
	// streams (whose stacks have grown to what a Handler's set-up needs);
	// nil starts a goroutine for each. A Handler that hands the stream's
	// copying to a goroutine of its own and returns suits it best.
	Workers *workers.Pool
	// Logger may be nil (discard).
	Logger *slog.Logger
	// Registerer may be nil (no metrics).
	Registerer prometheus.Registerer
}

// Server is the HBONE server (inbound 15008).
type Server struct {
	// Immutable after NewServer.
	tlsConf     *tls.Config
	handler     func(context.Context, *Request)
	connContext func(context.Context, *tls.ConnectionState) (context.Context, error)
	log         *slog.Logger
	metrics     *serverMetrics
	maxStreams  uint32
	ctx         context.Context
	cancel      context.CancelFunc // force-close: cancels every Serve'd conn
	workers     *workers.Pool      // runs serveStream; nil: a goroutine each

	shutting atomic.Bool  // Shutdown started; set under mu
	handlers atomic.Int64 // Handler calls in progress
	done     atomic.Bool  // Shutdown finished; late handlers return at once

	mu        sync.Mutex
	listeners map[net.Listener]struct{} // guarded by mu
	conns     map[*serverConn]struct{}  // guarded by mu
	idle      chan struct{}             // guarded by mu: closed when shutting with no conns and no handlers
}

// serverConn is one accepted connection.
type serverConn struct {
	// Immutable after addConn.
	raw    net.Conn
	remote netip.AddrPort
	local  netip.AddrPort
	tls    *tls.ConnectionState // set after the handshake, before HTTP/2
	h      *conn                // guarded by Server.mu: set once HTTP/2 runs
}

// NewServer returns a Server. Serve or ServeConn it; Shutdown or Close it.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.TLS == nil {
		return nil, errors.New("hbone: new server: ServerOptions.TLS is required")
	}
	if opts.Handler == nil {
		return nil, errors.New("hbone: new server: ServerOptions.Handler is required")
	}
	s := &Server{
		tlsConf:     tlsForHBONE(opts.TLS),
		handler:     opts.Handler,
		connContext: opts.ConnContext,
		workers:     opts.Workers,
		log:         opts.Logger,
		metrics:     newServerMetrics(opts.Registerer),
		listeners:   make(map[net.Listener]struct{}),
		conns:       make(map[*serverConn]struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.maxStreams = uint32(opts.MaxConcurrentStreams)
	if opts.MaxConcurrentStreams <= 0 {
		s.maxStreams = DefaultServerMaxConcurrentStreams
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Serve accepts connections on ln until Shutdown or Close, serving each on
// its own goroutine. It closes ln on return and returns ErrServerClosed
// after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.shutting.Load() {
				return ErrServerClosed
			}
			if !temporaryAcceptError(err) {
				return fmt.Errorf("hbone: accept: %w", err)
			}
			// Out of fds or similar: back off rather than spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("hbone: accept failed; retrying", "error", err, "backoff", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.ctx.Done():
				t.Stop()
				return ErrServerClosed
			}
			continue
		}
		backoff = 0
		sc, ok := s.addConn(c)
		if !ok {
			_ = c.Close()
			return ErrServerClosed
		}
		go func() { _ = s.serveConn(s.ctx, sc) }()
	}
}

func temporaryAcceptError(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED)
}

// ServeConn serves one accepted connection (TLS handshake, then HTTP/2)
// and returns when it ends. Cancelling ctx closes the connection at once.
// It returns an error if the connection was rejected before HTTP/2.
func (s *Server) ServeConn(ctx context.Context, c net.Conn) error {
	sc, ok := s.addConn(c)
	if !ok {
		_ = c.Close()
		return ErrServerClosed
	}
	return s.serveConn(ctx, sc)
}

func (s *Server) addConn(c net.Conn) (*serverConn, bool) {
	sc := &serverConn{raw: c, remote: addrPortOf(c.RemoteAddr()), local: addrPortOf(c.LocalAddr())}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return nil, false
	}
	s.conns[sc] = struct{}{}
	return sc, true
}

func (s *Server) removeConn(sc *serverConn) {
	s.mu.Lock()
	delete(s.conns, sc)
	s.checkIdleLocked()
	s.mu.Unlock()
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

func (s *Server) serveConn(ctx context.Context, sc *serverConn) error {
	defer s.removeConn(sc)
	stop := context.AfterFunc(ctx, func() { _ = sc.raw.Close() })
	defer stop()

	reject := func(reason string, err error) error {
		s.metrics.reject(reason)
		s.log.Debug("hbone: connection rejected", "remote", sc.remote.String(), "reason", reason, "error", err)
		_ = sc.raw.Close()
		return fmt.Errorf("hbone: serve %s: %s: %w", sc.remote, reason, err)
	}
	tuneSocket(sc.raw)
	bt := newBatchTLS(sc.raw, false, s.tlsConf)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	err := bt.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return reject(ReasonTLSHandshake, err)
	}
	st := bt.ConnectionState()
	sc.tls = &st
	if st.Version != tls.VersionTLS13 || (st.NegotiatedProtocol != http2.NextProtoTLS && st.NegotiatedProtocol != "") {
		return reject(ReasonTLSVersion, fmt.Errorf("negotiated version %#x, ALPN %q; want TLS 1.3, h2", st.Version, st.NegotiatedProtocol))
	}
	connCtx := ctx
	if s.connContext != nil {
		if connCtx, err = s.connContext(connCtx, &st); err != nil {
			return reject(ReasonConnRejected, err)
		}
	}
	if s.shutting.Load() {
		_ = sc.raw.Close()
		return ErrServerClosed
	}
	s.metrics.connDelta(1)
	defer s.metrics.connDelta(-1)
	h := newConn(bt.afterHandshake(), connOptions{
		log:        s.log,
		countError: s.metrics.countError,
		maxStreams: s.maxStreams,
		onStream: func(hs *h2stream, mh *http2.MetaHeadersFrame) {
			s.startStream(connCtx, sc, hs, mh)
		},
	})
	// The preface must come within the handshake timeout too.
	_ = sc.raw.SetReadDeadline(time.Now().Add(handshakeTimeout))
	err = h.startServer()
	_ = sc.raw.SetReadDeadline(time.Time{})
	if err != nil {
		h.close(err)
		return reject(ReasonBadPreface, err)
	}
	// A connection that finished its handshake while Shutdown sent its
	// GOAWAYs gets one now.
	s.mu.Lock()
	sc.h = h
	late := s.shutting.Load()
	s.mu.Unlock()
	if late {
		h.goAway(http2.ErrCodeNo)
	}
	h.startKeepalive()
	h.readLoop()
	return nil
}

// Shutdown stops accepting, sends GOAWAY on every connection and waits for
// their streams (Handlers) to finish. At ctx's deadline it closes every
// connection, waits for Handlers to return, and returns ctx.Err().
// Shutdown and Close may be called more than once and concurrently.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := !s.shutting.Load()
	var lns []net.Listener
	if first {
		s.shutting.Store(true)
		s.idle = make(chan struct{})
		for ln := range s.listeners {
			lns = append(lns, ln)
		}
	}
	s.checkIdleLocked()
	idle := s.idle
	s.mu.Unlock()

	if first {
		for _, ln := range lns {
			_ = ln.Close()
		}
		s.mu.Lock()
		for sc := range s.conns {
			if sc.h != nil {
				sc.h.goAway(http2.ErrCodeNo)
			}
		}
		s.mu.Unlock()
	}
	select {
	case <-idle:
		s.done.Store(true)
		return nil
	case <-ctx.Done():
	}
	s.forceClose()
	<-idle
	s.done.Store(true)
	return ctx.Err()
}

// Close closes every connection at once (streams are reset) and waits for
// Handlers to return. It is Shutdown with an expired deadline.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.Shutdown(ctx)
	return nil
}

func (s *Server) forceClose() {
	s.cancel()
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	for _, sc := range conns {
		_ = sc.raw.Close()
	}
}

// checkIdleLocked closes s.idle once shutting down with nothing left.
func (s *Server) checkIdleLocked() {
	if s.idle == nil || len(s.conns) > 0 || s.handlers.Load() > 0 {
		return
	}
	select {
	case <-s.idle:
	default:
		close(s.idle)
	}
}

// startStream runs on the connection's reader goroutine for each new
// stream: it starts the stream's Handler, on one of ServerOptions.Workers'
// goroutines if set.
func (s *Server) startStream(connCtx context.Context, sc *serverConn, hs *h2stream, mh *http2.MetaHeadersFrame) {
	s.handlers.Add(1)
	ctx, cancel := context.WithCancel(connCtx)
	hs.c.mu.Lock()
	hs.onEnd = cancel
	ended := hs.ended
	hs.c.mu.Unlock()
	if ended {
		cancel()
	}
	s.workers.Go(func() { s.serveStream(ctx, cancel, sc, hs, mh) })
}

// serveStream validates the CONNECT and hands it to the Handler.
func (s *Server) serveStream(ctx context.Context, cancel context.CancelFunc, sc *serverConn, hs *h2stream, mh *http2.MetaHeadersFrame) {
	req := &Request{s: s, st: hs, conn: sc, TLS: sc.tls, RemoteAddr: sc.remote, LocalAddr: sc.local}
	counted := false
	req.end = func() {
		if counted {
			s.metrics.streamDelta(-1)
		}
		req.finish()
		cancel()
		if s.handlers.Add(-1) == 0 && s.shutting.Load() {
			s.mu.Lock()
			s.checkIdleLocked()
			s.mu.Unlock()
		}
	}
	defer func() {
		if !req.detached {
			req.end()
		}
	}()
	if s.done.Load() || ctx.Err() != nil {
		// Started after Shutdown finished, or the stream is already gone.
		req.answered.Store(true)
		req.respond(http.StatusServiceUnavailable, nil, true)
		return
	}
	s.metrics.streamDelta(1)
	counted = true

	method, authority := mh.PseudoValue("method"), mh.PseudoValue("authority")
	if mh.Truncated {
		// Over serverMaxHeaderBytes: the decoder dropped fields.
		s.rejectEarly(req, method, authority, http.StatusRequestHeaderFieldsTooLarge, ReasonHeadersTooLarge)
		return
	}
	if method != http.MethodConnect {
		s.rejectEarly(req, method, authority, http.StatusMethodNotAllowed, ReasonMethodNotAllowed)
		return
	}
	ap, err := ParseAuthority(authority)
	if err != nil {
		s.rejectEarly(req, method, authority, http.StatusBadRequest, ReasonBadAuthority)
		return
	}
	req.Authority = ap
	req.Header = make(http.Header, len(mh.RegularFields()))
	for _, f := range mh.RegularFields() {
		k := http.CanonicalHeaderKey(f.Name)
		req.Header[k] = append(req.Header[k], f.Value)
	}
	s.handler(ctx, req)
}

func (s *Server) rejectEarly(req *Request, method, authority string, code int, reason string) {
	s.metrics.reject(reason)
	s.log.Debug("hbone: request rejected", "method", method, "authority", authority, "remote", req.RemoteAddr.String(), "status", code, "reason", reason)
	req.answered.Store(true)
	req.respond(code, nil, true)
}
