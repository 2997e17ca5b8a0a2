package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
)

// rawRoundTrip sends one request on a fresh HTTP/2 connection to e's
// server, bypassing the pool's checks, and returns the status.
func rawRoundTrip(t *testing.T, e *testEnv, method, authority string) int {
	t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), e.ca.clientConfig(t, "client", "cli", spiffeID("server", "srv")))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	req := &http.Request{
		Method: method,
		URL:    &url.URL{Scheme: "https", Host: authority, Path: "/"},
		Host:   authority,
		Header: http.Header{},
	}
	if method == http.MethodConnect {
		req.URL = &url.URL{Host: authority}
	}
	resp, err := cc.RoundTrip(req.WithContext(testCtx(t)))
	if err != nil {
		t.Fatalf("%s %s: %v", method, authority, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestServerRejectsBadRequests(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		authority string
		want      int
		reason    string
	}{
		{name: "GET", method: http.MethodGet, authority: "10.0.0.1:80", want: 405, reason: ReasonMethodNotAllowed},
		{name: "POST", method: http.MethodPost, authority: "10.0.0.1:80", want: 405, reason: ReasonMethodNotAllowed},
		{name: "hostname authority", method: http.MethodConnect, authority: "example.com:80", want: 400, reason: ReasonBadAuthority},
		{name: "no port", method: http.MethodConnect, authority: "10.0.0.1", want: 400, reason: ReasonBadAuthority},
		{name: "port zero", method: http.MethodConnect, authority: "10.0.0.1:0", want: 400, reason: ReasonBadAuthority},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			e := newEnv(t, func(ctx context.Context, req *Request) { called = true; req.Reject(500, "unexpected") }, envOpts{})
			if got := rawRoundTrip(t, e, tc.method, tc.authority); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
			if called {
				t.Error("Handler was called for an invalid request")
			}
			if got := e.metric(t, "ztunnel_hbone_server_rejects_total", tc.reason); got != 1 {
				t.Errorf("rejects_total{%s} = %v, want 1", tc.reason, got)
			}
		})
	}
}

func TestServerHandlerRejects(t *testing.T) {
	// A port nothing listens on, so the handler's upstream dial fails.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()

	tests := []struct {
		name      string
		handler   func(context.Context, *Request)
		authority string
		want      int
		reason    string
	}{
		{
			name:      "denied by policy",
			handler:   func(ctx context.Context, req *Request) { req.Reject(http.StatusForbidden, "denied") },
			authority: "10.0.0.1:80",
			want:      403, reason: "denied",
		},
		{
			name:      "upstream dial fails",
			handler:   dialHandler,
			authority: refused,
			want:      503, reason: "dial_failed",
		},
		{
			name:      "handler returns without answering",
			handler:   func(ctx context.Context, req *Request) {},
			authority: "10.0.0.1:80",
			want:      500, reason: ReasonUnanswered,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.handler, envOpts{})
			_, err := e.pool.Connect(testCtx(t), e.key, tc.authority, nil)
			var se *StatusError
			if !errors.As(err, &se) || se.Code != tc.want {
				t.Fatalf("Connect: %v, want StatusError %d", err, tc.want)
			}
			if got := e.metric(t, "ztunnel_hbone_server_rejects_total", tc.reason); got != 1 {
				t.Errorf("rejects_total{%s} = %v, want 1", tc.reason, got)
			}
			if got := e.metric(t, "ztunnel_hbone_pool_streams", ""); got != 0 {
				t.Errorf("pool_streams after rejection %v, want 0 (slot leaked)", got)
			}
		})
	}
}

func TestTLSRejections(t *testing.T) {
	other := newTestCA(t)
	tests := []struct {
		name string
		// client returns the client TLS config; nil config means plaintext.
		client func(e *testEnv) *tls.Config
		pool   bool // through the Pool, else a raw connection
	}{
		{
			name:   "server presents an unexpected SAN",
			client: func(e *testEnv) *tls.Config { return e.ca.clientConfig(t, "client", "cli", spiffeID("other", "sa")) },
			pool:   true,
		},
		{
			name:   "client presents no certificate",
			client: func(e *testEnv) *tls.Config { return e.ca.clientConfig(t, "", "", spiffeID("server", "srv")) },
			pool:   true,
		},
		{
			name:   "client certificate from another CA",
			client: func(e *testEnv) *tls.Config { return other.clientConfig(t, "client", "cli") },
			pool:   true,
		},
		{
			name: "client offers only TLS 1.2",
			client: func(e *testEnv) *tls.Config {
				c := e.ca.clientConfig(t, "client", "cli")
				c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
				return c
			},
		},
		{name: "plaintext HTTP/1.1", client: func(*testEnv) *tls.Config { return nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			e := newEnv(t, func(ctx context.Context, req *Request) { called = true; req.Reject(500, "unexpected") }, envOpts{})
			cfg := tc.client(e)
			switch {
			case tc.pool:
				pool, err := NewPool(PoolOptions{TLS: func(Key) (*tls.Config, error) { return cfg, nil }})
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				if _, err := pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil); err == nil {
					t.Fatal("Connect succeeded")
				}
			case cfg != nil:
				if c, err := tls.Dial("tcp", e.ln.Addr().String(), cfg); err == nil {
					c.Close()
					t.Fatal("TLS 1.2 handshake succeeded")
				}
			default:
				c, err := net.Dial("tcp", e.ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal("server kept a plaintext connection open")
				}
			}
			// The server side fails at its own pace (TLS 1.3 client
			// handshakes complete before the server checks the client).
			waitFor(t, "server to count the rejection", func() bool {
				return e.metric(t, "ztunnel_hbone_server_rejects_total", ReasonTLSHandshake) >= 1
			})
			if called {
				t.Error("Handler was called")
			}
		})
	}
}

func TestServerConnContext(t *testing.T) {
	type peerKey struct{}
	e := newEnv(t, func(ctx context.Context, req *Request) {
		if ctx.Value(peerKey{}) != spiffeID("client", "cli") {
			req.Reject(403, "no_peer")
			return
		}
		req.Reject(418, "teapot")
	}, envOpts{server: func(o *ServerOptions) {
		// Accept any client certificate in TLS; ConnContext decides.
		o.TLS = o.TLS.Clone()
		o.TLS.VerifyPeerCertificate = nil
		o.ConnContext = func(ctx context.Context, cs *tls.ConnectionState) (context.Context, error) {
			id := cs.PeerCertificates[0].URIs[0].String()
			if id == spiffeID("client", "banned") {
				return nil, errors.New("banned")
			}
			return context.WithValue(ctx, peerKey{}, id), nil
		}
	}})
	_, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 418 {
		t.Fatalf("Connect: %v, want 418 (ConnContext value seen)", err)
	}
	banned := e.ca.clientConfig(t, "client", "banned", spiffeID("server", "srv"))
	pool, err := NewPool(PoolOptions{TLS: func(Key) (*tls.Config, error) { return banned, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil); err == nil {
		t.Fatal("banned peer connected")
	}
	waitFor(t, "rejects_total{conn_rejected}", func() bool {
		return e.metric(t, "ztunnel_hbone_server_rejects_total", ReasonConnRejected) >= 1
	})
}

func TestServerShutdownForcesAtDeadline(t *testing.T) {
	handlerDone := make(chan struct{})
	e := newEnv(t, func(ctx context.Context, req *Request) {
		defer close(handlerDone)
		st, err := req.Accept(nil)
		if err != nil {
			return
		}
		defer st.Close()
		io.Copy(io.Discard, st) // the client never ends the stream
	}, envOpts{})
	s, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := e.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
	}
	select {
	case <-handlerDone:
	default:
		t.Fatal("Shutdown returned before the Handler did")
	}
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Error("stream survived the forced shutdown")
	}
	if err := e.srv.Close(); err != nil {
		t.Errorf("Close after Shutdown: %v", err)
	}
	if err := e.srv.ServeConn(context.Background(), &net.TCPConn{}); !errors.Is(err, ErrServerClosed) {
		t.Errorf("ServeConn after Close: %v, want ErrServerClosed", err)
	}
}

func TestNoFDLeak(t *testing.T) {
	// Warm up the runtime's poller so its fds are in the baseline.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	// Earlier tests' connections close asynchronously (x/net's read
	// loops); wait for them so the baseline is stable.
	goleak.VerifyNone(t)
	before := countFDs(t)
	t.Run("traffic", func(t *testing.T) {
		echo := startTCP(t, echoTCP)
		e := newEnv(t, dialHandler, envOpts{pool: func(o *PoolOptions) { o.MaxStreamsPerConn = 3 }})
		ctx := testCtx(t)
		var streams []*Stream
		for range 10 {
			s, err := e.pool.Connect(ctx, e.key, echo.String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		for i, s := range streams {
			s.Write([]byte("ping"))
			if i%2 == 0 {
				s.CloseWrite()
				io.ReadAll(s)
			}
			s.Close() // odd ones are reset
		}
		if _, err := e.pool.Connect(ctx, e.key, "127.0.0.1:1", nil); err == nil {
			t.Error("Connect to a closed port succeeded")
		}
	})
	goleak.VerifyNone(t)
	if after := countFDs(t); after != before {
		t.Errorf("open fds: %d before, %d after", before, after)
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			t.Log(e.Name(), l)
		}
	}
}

// TestServerRejectsOversizedHeaders: a CONNECT whose header block is over
// the server's limit gets 431 and a counted reason, not a truncated
// request handed to the Handler.
func TestServerRejectsOversizedHeaders(t *testing.T) {
	called := false
	e := newEnv(t, func(ctx context.Context, req *Request) { called = true; req.Reject(500, "unexpected") }, envOpts{})
	hdr := &ConnectHeader{Extra: http.Header{"X-Big": {strings.Repeat("a", serverMaxHeaderBytes)}}}
	_, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", hdr)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("Connect: %v, want status 431", err)
	}
	if called {
		t.Error("Handler was called for a truncated request")
	}
	if got := e.metric(t, "ztunnel_hbone_server_rejects_total", ReasonHeadersTooLarge); got != 1 {
		t.Errorf("rejects_total{%s} = %v, want 1", ReasonHeadersTooLarge, got)
	}
}

// TestDetach: a Handler that detaches returns at once; its stream keeps
// working on another goroutine, the Handler's context stays live, and
// Shutdown waits for finish, not for the Handler's return.
func TestDetach(t *testing.T) {
	returned := make(chan struct{})
	finished := make(chan struct{})
	e := newEnv(t, func(ctx context.Context, req *Request) {
		st, err := req.Accept(nil)
		if err != nil {
			return
		}
		finish := req.Detach()
		go func() {
			defer close(finished)
			<-returned
			if ctx.Err() != nil {
				t.Error("the Handler's context ended when it returned")
			}
			io.Copy(st, st) // echo until the client half-closes
			st.CloseWrite()
			finish()
			finish() // harmless
			if ctx.Err() == nil {
				t.Error("finish left the Handler's context live")
			}
		}()
		defer close(returned)
	}, envOpts{})
	s, err := e.pool.Connect(testCtx(t), e.key, "10.0.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recvTimeout(t, returned, "handler return")
	s.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("after the handler returned")
	if _, err := s.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo %q, %v", got, err)
	}
	// Shutdown must wait for the detached stream: it is still open.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a detached stream open: %v, want DeadlineExceeded", err)
	}
	recvTimeout(t, finished, "finish after the forced shutdown")
}
