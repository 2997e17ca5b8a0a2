package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// countingListener counts accepted connections and reports closed ones.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
	closed   chan struct{} // one value per closed accepted conn
}

func newCountingListener(t testing.TB) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &countingListener{Listener: ln, closed: make(chan struct{}, 4096)}
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &trackedConn{Conn: c, closed: l.closed}, nil
}

func (l *countingListener) addr() netip.AddrPort {
	return l.Addr().(*net.TCPAddr).AddrPort()
}

type trackedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.Conn.Close()
}

// testEnv is a Server on 127.0.0.1:0 and a Pool pointed at it, both with
// certificates from one test CA. The server is ns "server" / sa "srv",
// the client "client" / "cli".
type testEnv struct {
	ca   *testCA
	ln   *countingListener
	srv  *Server
	pool *Pool
	reg  *prometheus.Registry
	key  Key
	tlsN atomic.Int64 // PoolOptions.TLS calls
}

type envOpts struct {
	pool   func(*PoolOptions)
	server func(*ServerOptions)
}

func newEnv(t testing.TB, handler func(context.Context, *Request), o envOpts) *testEnv {
	t.Helper()
	e := &testEnv{ca: newTestCA(t), ln: newCountingListener(t), reg: prometheus.NewRegistry()}
	sopts := ServerOptions{
		TLS:        e.ca.serverConfig(t, "server", "srv", spiffeID("client", "cli")),
		Handler:    handler,
		Registerer: e.reg,
	}
	if o.server != nil {
		o.server(&sopts)
	}
	srv, err := NewServer(sopts)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(e.ln) }()

	clientTLS := e.ca.clientConfig(t, "client", "cli", spiffeID("server", "srv"))
	popts := PoolOptions{
		TLS: func(Key) (*tls.Config, error) {
			e.tlsN.Add(1)
			return clientTLS, nil
		},
		Registerer: e.reg,
	}
	if o.pool != nil {
		o.pool(&popts)
	}
	pool, err := NewPool(popts)
	if err != nil {
		t.Fatal(err)
	}
	e.pool = pool
	e.key = Key{
		Src:  identity.New("", "client", "cli"),
		Dst:  DstIdentities(identity.New("", "server", "srv")),
		Addr: e.ln.addr(),
	}
	t.Cleanup(func() {
		_ = pool.Close()
		_ = srv.Close()
		if err := <-serveDone; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return e
}

// counter returns the value of a counter or gauge with the given label
// value ("" for none) from the env's registry.
func (e *testEnv) metric(t testing.TB, name, label string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// startEcho runs a TCP server on 127.0.0.1:0 that calls serve for each
// connection; it stops (and waits) at cleanup.
func startTCP(t testing.TB, serve func(*net.TCPConn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				serve(c.(*net.TCPConn))
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// tcpPair returns the two ends of a loopback TCP connection, closed at
// the test's end. The kernel completes the handshake before Accept, so
// no goroutine is needed.
func tcpPair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return d.(*net.TCPConn), a.(*net.TCPConn)
}

// echoTCP copies a connection back to itself and half-closes at EOF. It
// hides ReadFrom so the runtime does not splice through a pooled pipe
// (those pipe fds outlive the test and would trip the fd-leak check).
func echoTCP(c *net.TCPConn) {
	buf := make([]byte, 64<<10)
	if _, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf); err == nil {
		c.CloseWrite()
	}
}

// dialHandler is the inbound proxy in miniature: dial the authority,
// Accept only once the dial worked, copy both ways with half-close, and
// propagate resets.
func dialHandler(ctx context.Context, req *Request) {
	up, err := (&net.Dialer{}).DialContext(ctx, "tcp", req.Authority.String())
	if err != nil {
		_ = req.Reject(503, "dial_failed")
		return
	}
	defer up.Close()
	st, err := req.Accept(nil)
	if err != nil {
		return
	}
	defer st.Close()
	tcp := up.(*net.TCPConn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(tcp, st); err != nil {
			tcp.SetLinger(0)
			tcp.Close()
			return
		}
		tcp.CloseWrite()
	}()
	if _, err := io.Copy(st, tcp); err != nil {
		st.Reset()
	} else {
		st.CloseWrite()
	}
	<-done
}

// echoHandler accepts and echoes the stream back to the client.
func echoHandler(ctx context.Context, req *Request) {
	st, err := req.Accept(nil)
	if err != nil {
		return
	}
	defer st.Close()
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(st, st, buf); err != nil {
		st.Reset()
		return
	}
	st.CloseWrite()
}

// waitFor polls cond until it holds or 10s pass. Only for state that
// offers no channel to wait on (x/net connection state).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recvTimeout waits for one value on ch.
func recvTimeout[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func countFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
