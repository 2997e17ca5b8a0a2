package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// holdHandler accepts and keeps the stream until the client ends it,
// tracking the most streams seen at once per TCP connection.
type holdHandler struct {
	mu     sync.Mutex
	active map[string]int
	peak   int
}

func (h *holdHandler) handle(ctx context.Context, req *Request) {
	conn := req.RemoteAddr.String()
	h.mu.Lock()
	if h.active == nil {
		h.active = map[string]int{}
	}
	h.active[conn]++
	h.peak = max(h.peak, h.active[conn])
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.active[conn]--
		h.mu.Unlock()
	}()
	st, err := req.Accept(nil)
	if err != nil {
		return
	}
	defer st.Close()
	io.Copy(io.Discard, st)
}

func TestPoolStreamLimits(t *testing.T) {
	tests := []struct {
		name      string
		streams   int
		perConn   int // PoolOptions.MaxStreamsPerConn
		serverMax int // ServerOptions.MaxConcurrentStreams; 0 default
		wantMin   int // TCP connections
		wantMax   int
		wantPeak  int // most streams on one connection
	}{
		{name: "1000 streams, 100 per connection", streams: 1000, perConn: 100, wantMin: 10, wantMax: 10, wantPeak: 100},
		{name: "50 streams, 7 per connection", streams: 50, perConn: 7, wantMin: 8, wantMax: 8, wantPeak: 7},
		// The peer's limit is learned when the first connection is set up;
		// waiters over-committed to the first dials move to new ones.
		{name: "peer allows 4, pool 10", streams: 20, perConn: 10, serverMax: 4, wantMin: 5, wantMax: 5, wantPeak: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &holdHandler{}
			e := newEnv(t, h.handle, envOpts{
				pool:   func(o *PoolOptions) { o.MaxStreamsPerConn = tc.perConn },
				server: func(o *ServerOptions) { o.MaxConcurrentStreams = tc.serverMax },
			})
			ctx := testCtx(t)
			streams := make([]*Stream, tc.streams)
			errs := make([]error, tc.streams)
			var wg sync.WaitGroup
			for i := range streams {
				wg.Go(func() { streams[i], errs[i] = e.pool.Connect(ctx, e.key, "10.0.0.1:80", nil) })
			}
			wg.Wait()
			// Every stream is open at this point, so they were concurrent.
			for i, err := range errs {
				if err != nil {
					t.Fatalf("stream %d: %v", i, err)
				}
			}
			if n := int(e.ln.accepted.Load()); n < tc.wantMin || n > tc.wantMax {
				t.Errorf("%d TCP connections, want %d..%d", n, tc.wantMin, tc.wantMax)
			}
			h.mu.Lock()
			peak := h.peak
			h.mu.Unlock()
			if peak != tc.wantPeak {
				t.Errorf("peak streams per connection %d, want %d", peak, tc.wantPeak)
			}
			if got := e.metric(t, "ztunnel_hbone_pool_streams", ""); got != float64(tc.streams) {
				t.Errorf("pool_streams gauge %v, want %d", got, tc.streams)
			}
			for _, s := range streams {
				s.Close()
			}
			if got := e.metric(t, "ztunnel_hbone_pool_streams", ""); got != 0 {
				t.Errorf("pool_streams gauge after close %v, want 0", got)
			}
		})
	}
}

func TestPoolCoalescesFirstDial(t *testing.T) {
	const n = 50
	release := make(chan struct{})
	var claims, dials atomic.Int64
	e := newEnv(t, (&holdHandler{}).handle, envOpts{pool: func(o *PoolOptions) {
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			if k, ok := KeyFromContext(ctx); !ok || k.Addr.String() != addr {
				return nil, errors.New("dial context lacks the key")
			}
			select {
			case <-release: // every other Connect is waiting on this dial
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
	}})
	e.pool.testHookClaim = func() {
		if claims.Add(1) == n-1 {
			close(release)
		}
	}
	ctx := testCtx(t)
	var wg sync.WaitGroup
	streams := make([]*Stream, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { streams[i], errs[i] = e.pool.Connect(ctx, e.key, "10.0.0.1:80", nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		defer streams[i].Close()
	}
	if d, tl, a := dials.Load(), e.tlsN.Load(), e.ln.accepted.Load(); d != 1 || tl != 1 || a != 1 {
		t.Errorf("dials %d, TLS configs %d, accepted %d; want 1 each", d, tl, a)
	}
}

func TestPoolDialErrorReachesAllWaiters(t *testing.T) {
	const n = 10
	release := make(chan struct{})
	var claims atomic.Int64
	e := newEnv(t, (&holdHandler{}).handle, envOpts{pool: func(o *PoolOptions) {
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			<-release
			return nil, errors.New("no route")
		}
	}})
	e.pool.testHookClaim = func() {
		if claims.Add(1) == n-1 {
			close(release)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil) })
	}
	wg.Wait()
	for i, err := range errs {
		var ce *ConnectError
		if !errors.As(err, &ce) || ce.Reason != ReasonDial {
			t.Errorf("stream %d: %v, want ConnectError reason %s", i, err, ReasonDial)
		}
	}
	if got := e.metric(t, "ztunnel_hbone_pool_dials_total", ReasonDial); got != 1 {
		t.Errorf("dials_total{dial} = %v, want 1", got)
	}
}

func TestPoolConnectContextCancelled(t *testing.T) {
	e := newEnv(t, func(ctx context.Context, req *Request) {
		<-ctx.Done() // never answers until the client gives up
	}, envOpts{})
	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() {
		_, err := e.pool.Connect(ctx, e.key, "10.0.0.1:80", nil)
		errc <- err
	}()
	// Cancel once the server has the request; with no answer, Connect can
	// only return through ctx.
	waitFor(t, "stream on server", func() bool { return e.metric(t, "ztunnel_hbone_server_streams", "") == 1 })
	cancel()
	if err := recvTimeout(t, errc, "Connect"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect: %v, want context.Canceled", err)
	}
	waitFor(t, "server stream to end", func() bool { return e.metric(t, "ztunnel_hbone_server_streams", "") == 0 })
}

func TestPoolIdleRelease(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{pool: func(o *PoolOptions) { o.IdleTimeout = 50 * time.Millisecond }})
	ctx := testCtx(t)
	use := func() {
		t.Helper()
		s, err := e.pool.Connect(ctx, e.key, "10.0.0.1:80", nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte("x"))
		s.CloseWrite()
		if b, err := io.ReadAll(s); err != nil || string(b) != "x" {
			t.Fatalf("echo %q, %v", b, err)
		}
		s.Close()
	}
	use()
	recvTimeout(t, e.ln.closed, "idle connection to close")
	if got := e.metric(t, "ztunnel_hbone_pool_connections", ""); got != 0 {
		t.Errorf("pool_connections after idle close %v, want 0", got)
	}
	use()
	if n := e.ln.accepted.Load(); n != 2 {
		t.Errorf("accepted %d connections, want 2 (a new one after idle close)", n)
	}
}

func TestPoolNewConnectionAfterGoAway(t *testing.T) {
	tests := []struct {
		name     string
		graceful bool
	}{
		{name: "graceful shutdown sends GOAWAY", graceful: true},
		{name: "connection force-closed", graceful: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca := newTestCA(t)
			ln := newCountingListener(t)
			mk := func() *Server {
				s, err := NewServer(ServerOptions{TLS: ca.serverConfig(t, "server", "srv"), Handler: echoHandler})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			// The first connection goes to srvA, later ones to srvB, so
			// srvA can be shut down while the port keeps accepting.
			srvA, srvB := mk(), mk()
			var wg sync.WaitGroup
			wg.Go(func() {
				for first := true; ; first = false {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					srv := srvB
					if first {
						srv = srvA
					}
					wg.Go(func() { srv.ServeConn(context.Background(), c) })
				}
			})
			defer func() {
				ln.Close()
				srvA.Close()
				srvB.Close()
				wg.Wait()
			}()
			clientTLS := ca.clientConfig(t, "client", "cli", spiffeID("server", "srv"))
			pool, err := NewPool(PoolOptions{TLS: func(Key) (*tls.Config, error) { return clientTLS, nil }})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			key := Key{Addr: ln.addr()}
			ctx := testCtx(t)
			echo := func(s *Stream, msg string) {
				t.Helper()
				if _, err := s.Write([]byte(msg)); err != nil {
					t.Fatalf("write: %v", err)
				}
				b := make([]byte, len(msg))
				if _, err := io.ReadFull(s, b); err != nil || string(b) != msg {
					t.Fatalf("echo %q: got %q, %v", msg, b, err)
				}
			}

			s1, err := pool.Connect(ctx, key, "10.0.0.1:80", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s1.Close()
			echo(s1, "one")

			shutdownErr := make(chan error, 1)
			if tc.graceful {
				go func() {
					sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					shutdownErr <- srvA.Shutdown(sctx)
				}()
				waitFor(t, "GOAWAY at the client", func() bool { return s1.conn.h.closing() })
			} else {
				srvA.Close()
				if _, err := s1.Read(make([]byte, 1)); err == nil {
					t.Fatal("read on a force-closed connection succeeded")
				}
			}

			s2, err := pool.Connect(ctx, key, "10.0.0.1:80", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			echo(s2, "two")
			if n := ln.accepted.Load(); n != 2 {
				t.Errorf("accepted %d connections, want 2", n)
			}
			if s2.conn == s1.conn {
				t.Error("second stream reused the old connection")
			}
			if tc.graceful {
				echo(s1, "still up") // streams in flight survive GOAWAY
				s1.CloseWrite()
				io.Copy(io.Discard, s1)
				s1.Close()
				if err := recvTimeout(t, shutdownErr, "graceful shutdown"); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			}
		})
	}
}

func TestPoolClosed(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	s, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.pool.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Error("stream survived pool Close")
	}
	s.Close()
	if _, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil); !errors.Is(err, ErrPoolClosed) {
		t.Errorf("Connect after Close: %v, want ErrPoolClosed", err)
	}
	if err := e.pool.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestConnectBadAuthority(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	for _, a := range []string{"", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:99999", ":80", "a b:80", "user@host:80"} {
		if _, err := e.pool.Connect(testCtx(t), e.key, a, nil); err == nil {
			t.Errorf("Connect(%q) succeeded", a)
		}
	}
	if n := e.ln.accepted.Load(); n != 0 {
		t.Errorf("bad authorities dialed %d connections", n)
	}
}

// serverTLS completes the server side of a TLS handshake on c with e's
// server certificate; nil if it failed.
func (e *testEnv) serverTLS(t testing.TB, c net.Conn) *tls.Conn {
	sc := tls.Server(c, e.ca.serverConfig(t, "server", "srv", spiffeID("client", "cli")))
	if sc.Handshake() != nil {
		return nil
	}
	return sc
}

// fakePeer is a TLS server that hands each connection, once its
// handshake is done, to serve; it returns e's key pointed at it.
func (e *testEnv) fakePeer(t testing.TB, serve func(*tls.Conn)) Key {
	key := e.key
	key.Addr = startTCP(t, func(c *net.TCPConn) {
		if sc := e.serverTLS(t, c); sc != nil {
			serve(sc)
		}
	})
	return key
}

// closeUnderPreface serves as a server that drops the connection before
// its HTTP/2 handshake would: it closes under the client's preface.
func closeUnderPreface(sc *tls.Conn) {
	_, _ = io.ReadFull(sc, make([]byte, len(http2.ClientPreface)))
	_ = sc.Close()
}

// A new connection the peer closes before its SETTINGS costs the streams
// waiting on it nothing but another dial.
func TestPoolRetriesConnectionClosedAfterHandshake(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	var accepted atomic.Int64
	key := e.key
	key.Addr = startTCP(t, func(c *net.TCPConn) {
		if accepted.Add(1) == 1 {
			if sc := e.serverTLS(t, c); sc != nil {
				closeUnderPreface(sc)
			}
			return
		}
		// Later connections go through to the real server.
		up, err := net.Dial("tcp", e.ln.addr().String())
		if err != nil {
			return
		}
		go func() {
			io.Copy(up, c)
			up.Close()
		}()
		io.Copy(c, up)
	})
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			s, err := e.pool.Connect(testCtx(t), key, "10.0.0.1:80", nil)
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			s.Write([]byte("x"))
			s.CloseWrite()
			if b, err := io.ReadAll(s); err != nil || string(b) != "x" {
				errs[i] = fmt.Errorf("echo: %q, %v", b, err)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("stream %d: %v", i, err)
		}
	}
	if got := e.metric(t, "ztunnel_hbone_pool_dials_total", ReasonHTTP2); got != 1 {
		t.Errorf("dials_total{%s} = %v, want 1 (the closed connection)", ReasonHTTP2, got)
	}
}

// A peer that keeps closing new connections after the handshake fails
// Connect after its retries, with an error that says how far the
// connection got: the access log line is all a user has.
func TestPoolPeerClosesAfterHandshake(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	key := e.fakePeer(t, closeUnderPreface)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { _, errs[i] = e.pool.Connect(testCtx(t), key, "10.0.0.1:80", nil) })
	}
	wg.Wait()
	for i, err := range errs {
		var ce *ConnectError
		if !errors.As(err, &ce) || ce.Reason != ReasonHTTP2 || !strings.Contains(err.Error(), "closed the connection before its SETTINGS") {
			t.Errorf("stream %d: %v; want ConnectError reason %s saying the peer closed before its SETTINGS", i, err, ReasonHTTP2)
		}
	}
	if got := e.metric(t, "ztunnel_hbone_pool_dials_total", ReasonHTTP2); got < maxConnectAttempts {
		t.Errorf("dials_total{%s} = %v, want at least %d (one per attempt)", ReasonHTTP2, got, maxConnectAttempts)
	}
}

// A server may send its SETTINGS before it has read the client preface
// (upstream's HTTP/2 server does, on the TLS handshake's heels). The
// preface must still be the first thing the server reads: a SETTINGS ACK
// ahead of it got the connection closed.
func TestPoolPrefaceBeforeSettingsAck(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	settingsSent := make(chan struct{}, maxConnectAttempts)
	var conns, good atomic.Int64
	key := e.fakePeer(t, func(sc *tls.Conn) {
		conns.Add(1)
		if err := http2.NewFramer(sc, nil).WriteSettings(); err != nil {
			return
		}
		settingsSent <- struct{}{}
		pre := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(sc, pre); err == nil && string(pre) == http2.ClientPreface {
			good.Add(1)
		}
		// Say nothing more: the CONNECT waits out its context.
		_, _ = io.Copy(io.Discard, sc)
	})
	// Hold the preface until the server's SETTINGS have had time to
	// arrive: a reader running by then would acknowledge them first.
	e.pool.testHookPreface = func() {
		select {
		case <-settingsSent:
			time.Sleep(50 * time.Millisecond)
		case <-time.After(5 * time.Second):
		}
	}
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	_, _ = e.pool.Connect(ctx, key, "10.0.0.1:80", nil)
	if n, g := conns.Load(), good.Load(); n == 0 || g != n {
		t.Errorf("%d of %d connections began with the client preface; want all", g, n)
	}
}

// A peer that answers every new connection with its SETTINGS and then
// closes it costs a Connect a bounded number of dials, not a redial loop
// until the caller's deadline.
func TestPoolPeerClosesEveryConnection(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	var conns atomic.Int64
	key := e.fakePeer(t, func(sc *tls.Conn) {
		conns.Add(1)
		_ = http2.NewFramer(sc, nil).WriteSettings()
		closeUnderPreface(sc)
	})
	ctx := testCtx(t)
	_, err := e.pool.Connect(ctx, key, "10.0.0.1:80", nil)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Connect: %v (context: %v); want an error before the deadline", err, ctx.Err())
	}
	if n := conns.Load(); n > maxConnectAttempts*maxConnectAttempts {
		t.Errorf("%d connections for one Connect; want at most %d", n, maxConnectAttempts*maxConnectAttempts)
	}
}
