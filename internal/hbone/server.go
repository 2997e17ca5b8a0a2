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
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// TLS is the server config: our certificate, and a client-certificate
	// requirement that verifies the peer (e.g. RequireAnyClientCert plus
	// VerifyPeerCertificate checking the SPIFFE chain). Required. The
	// server adds ALPN "h2" and MinVersion TLS 1.3 if missing.
	TLS *tls.Config
	// Handler is called once per valid CONNECT stream, on its own
	// goroutine; it must Accept or Reject the Request, and the stream lives
	// until Handler returns. ctx is cancelled when the stream or the
	// connection ends; Handler must return promptly after that. Required.
	Handler func(ctx context.Context, req *Request)
	// ConnContext, if set, runs once per connection after the TLS
	// handshake: it can derive the peer identity once and store it in the
	// returned context (Handler's ctx descends from it), or return an error
	// to close the connection. May be nil.
	ConnContext func(ctx context.Context, cs *tls.ConnectionState) (context.Context, error)
	// MaxConcurrentStreams is advertised in SETTINGS; 0 means
	// DefaultServerMaxConcurrentStreams.
	MaxConcurrentStreams int
	// Logger may be nil (discard).
	Logger *slog.Logger
	// Registerer may be nil (no metrics).
	Registerer prometheus.Registerer

	tuning *h2Tuning // benchmarks only; nil is defaultTuning
}

// Server is the HBONE server (inbound 15008).
type Server struct {
	// Immutable after NewServer.
	tlsConf     *tls.Config
	handler     func(context.Context, *Request)
	connContext func(context.Context, *tls.ConnectionState) (context.Context, error)
	log         *slog.Logger
	metrics     *serverMetrics
	h2          *http2.Server
	hs          *http.Server // base config of h2; its Shutdown sends GOAWAY
	batch       bool         // gather TLS records of large writes (batch.go)
	ctx         context.Context
	cancel      context.CancelFunc // force-close: cancels every Serve'd conn

	shutting atomic.Bool  // Shutdown started; set under mu
	handlers atomic.Int64 // Handler calls in progress
	done     atomic.Bool  // Shutdown finished; late handlers return at once

	mu        sync.Mutex
	listeners map[net.Listener]struct{} // guarded by mu
	conns     map[*serverConn]struct{}  // guarded by mu
	idle      chan struct{}             // guarded by mu: closed when shutting with no conns and no handlers
}

// serverConn is one accepted connection; immutable after addConn.
type serverConn struct {
	raw    net.Conn
	remote netip.AddrPort
	local  netip.AddrPort
	tls    *tls.ConnectionState // set after the handshake, before HTTP/2
}

type connInfoKey struct{}

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
		log:         opts.Logger,
		metrics:     newServerMetrics(opts.Registerer),
		listeners:   make(map[net.Listener]struct{}),
		conns:       make(map[*serverConn]struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	maxStreams := opts.MaxConcurrentStreams
	if maxStreams <= 0 {
		maxStreams = DefaultServerMaxConcurrentStreams
	}
	tu := tuningOrDefault(opts.tuning)
	h2, hs, err := newH2Server(tu, uint32(maxStreams), s.metrics.countError, s.log)
	if err != nil {
		return nil, err
	}
	s.h2, s.hs, s.batch = h2, hs, !tu.noBatch
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
	var tc *tls.Conn
	var h2conn net.Conn
	if s.batch {
		bt := newBatchTLS(sc.raw, false, s.tlsConf)
		tc, h2conn = bt.Conn, bt
	} else {
		tc = tls.Server(sc.raw, s.tlsConf)
		h2conn = tc
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return reject(ReasonTLSHandshake, err)
	}
	st := tc.ConnectionState()
	sc.tls = &st
	if st.Version != tls.VersionTLS13 || (st.NegotiatedProtocol != http2.NextProtoTLS && st.NegotiatedProtocol != "") {
		return reject(ReasonTLSVersion, fmt.Errorf("negotiated version %#x, ALPN %q; want TLS 1.3, h2", st.Version, st.NegotiatedProtocol))
	}
	connCtx := context.WithValue(ctx, connInfoKey{}, sc)
	if s.connContext != nil {
		if connCtx, err = s.connContext(connCtx, &st); err != nil {
			return reject(ReasonConnRejected, err)
		}
	}
	if s.shutting.Load() {
		_ = tc.Close()
		return ErrServerClosed
	}
	s.metrics.connDelta(1)
	defer s.metrics.connDelta(-1)
	s.h2.ServeConn(&goAwayLateConn{Conn: h2conn, tls: tc, s: s}, &http2.ServeConnOpts{
		Context:    connCtx,
		BaseConfig: s.hs,
		Handler:    h2Handler{s},
	})
	return nil
}

// goAwayLateConn closes a race: a connection that finished its handshake
// just as Shutdown broadcast GOAWAY is registered with x/net only after
// the broadcast. x/net registers before its first Read, so the first Read
// repeats the broadcast if a shutdown is under way (it is idempotent per
// connection). It has ConnectionState so x/net still sees TLS.
type goAwayLateConn struct {
	net.Conn
	tls  *tls.Conn
	s    *Server
	once sync.Once
}

func (c *goAwayLateConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

func (c *goAwayLateConn) Read(p []byte) (int, error) {
	c.once.Do(func() {
		if c.s.shutting.Load() {
			_ = c.s.hs.Shutdown(context.Background())
		}
	})
	return c.Conn.Read(p)
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
		// Runs x/net's GOAWAY hook on every HTTP/2 connection; returns at
		// once since hs tracks no connections of its own.
		_ = s.hs.Shutdown(context.Background())
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

// h2Handler is the http.Handler given to x/net: it validates the CONNECT
// and hands it to ServerOptions.Handler.
type h2Handler struct{ s *Server }

func (h h2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	s.handlers.Add(1)
	defer func() {
		if s.handlers.Add(-1) == 0 && s.shutting.Load() {
			s.mu.Lock()
			s.checkIdleLocked()
			s.mu.Unlock()
		}
	}()
	if s.done.Load() || r.Context().Err() != nil {
		// Started after Shutdown finished, or the stream is already gone.
		// Answer anyway: x/net would otherwise send an empty 200.
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	s.metrics.streamDelta(1)
	defer s.metrics.streamDelta(-1)
	// No Date header: upstream sends none and formatting it costs per stream.
	w.Header()["Date"] = nil

	if r.Method != http.MethodConnect {
		s.rejectEarly(w, r, http.StatusMethodNotAllowed, ReasonMethodNotAllowed)
		return
	}
	ap, err := ParseAuthority(r.Host)
	if err != nil {
		s.rejectEarly(w, r, http.StatusBadRequest, ReasonBadAuthority)
		return
	}
	req := &Request{
		Authority: ap,
		Header:    r.Header,
		s:         s,
		w:         w,
		r:         r,
	}
	// x/net leaves r.TLS nil for CONNECT (it has no :scheme); the
	// connection's state was kept at the handshake.
	if sc, ok := r.Context().Value(connInfoKey{}).(*serverConn); ok {
		req.TLS, req.RemoteAddr, req.LocalAddr, req.conn = sc.tls, sc.remote, sc.local, sc
	}
	defer req.finish()
	s.handler(r.Context(), req)
}

func (s *Server) rejectEarly(w http.ResponseWriter, r *http.Request, code int, reason string) {
	s.metrics.reject(reason)
	s.log.Debug("hbone: request rejected", "method", r.Method, "authority", r.Host, "remote", r.RemoteAddr, "status", code, "reason", reason)
	w.WriteHeader(code)
}
