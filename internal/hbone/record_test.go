package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/internal/aesgcm"
)

// recordHandshake runs our side of a handshake over c (as newBatchTLS's
// callers do) and returns what the connection would read and write.
func recordHandshake(t *testing.T, c net.Conn, client bool, cfg *tls.Config) wire {
	t.Helper()
	bt := newBatchTLS(c, client, tlsForHBONE(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bt.HandshakeContext(ctx); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return bt.afterHandshake()
}

// referenceTLS runs crypto/tls's side of the handshake in the background.
func referenceTLS(t *testing.T, c net.Conn, client bool, cfg *tls.Config) <-chan *tls.Conn {
	ch := make(chan *tls.Conn, 1)
	go func() {
		var tc *tls.Conn
		if client {
			tc = tls.Client(c, cfg)
		} else {
			tc = tls.Server(c, cfg)
		}
		if err := tc.Handshake(); err != nil {
			t.Errorf("reference handshake: %v", err)
			tc = nil
		}
		ch <- tc
	}()
	return ch
}

func asRecordConn(t *testing.T, w wire) *recordConn {
	t.Helper()
	rc, ok := w.(*recordConn)
	if !ok {
		t.Fatalf("after the handshake the connection uses %T, want the record layer", w)
	}
	return rc
}

// exchange sends data one way and checks it arrives intact, reading with
// buf-sized reads (small ones open records in place, large ones straight
// into the caller's buffer).
func exchange(t *testing.T, w io.Writer, r io.Reader, size, buf int) {
	t.Helper()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	sent := bytes.Clone(data)
	errc := make(chan error, 1)
	go func() {
		_, err := w.Write(data)
		errc <- err
	}()
	got := make([]byte, 0, size)
	p := make([]byte, buf)
	for len(got) < size {
		n, err := r.Read(p)
		got = append(got, p[:n]...)
		if err != nil {
			t.Fatalf("read after %d of %d bytes: %v", len(got), size, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatalf("%d bytes arrived changed", size)
	}
	if !bytes.Equal(data, sent) {
		t.Fatal("Write left its input changed")
	}
}

// cryptoTLSServer runs crypto/tls's server (no client certificate asked)
// on one end of a TCP pair and returns the other end with a client config
// that offers resumption: that is what makes crypto/tls's server send a
// session ticket right after the handshake, sealed under the application
// keys, which the client's record layer must then take.
func cryptoTLSServer(t *testing.T) (net.Conn, *tls.Config, <-chan *tls.Conn) {
	ca := newTestCA(t)
	a, b := tcpPair(t)
	scfg := ca.serverConfig(t, "ns", "server")
	scfg.ClientAuth = tls.NoClientCert
	ccfg := ca.clientConfig(t, "", "")
	ccfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	return a, ccfg, referenceTLS(t, b, false, scfg)
}

// Our client against crypto/tls's server, which sends a session ticket
// right after the handshake and a close_notify when it closes: both are
// records our layer must take.
func TestRecordLayerClientWithCryptoTLS(t *testing.T) {
	a, ccfg, ref := cryptoTLSServer(t)
	ours := asRecordConn(t, recordHandshake(t, a, true, ccfg))
	srv := <-ref
	if srv == nil {
		t.FailNow()
	}
	for _, buf := range []int{1 << 20, 4 << 10, 100} {
		exchange(t, ours, srv, 3<<20+7, buf)
		exchange(t, srv, ours, 3<<20+7, buf)
	}
	if ours.in.seq == 0 || ours.out.seq == 0 {
		t.Fatalf("sequence numbers in %d out %d: records did not go through the record layer", ours.in.seq, ours.out.seq)
	}
	if ours.rbuf != nil {
		t.Error("the read buffer is held after all data was read")
	}
	_ = srv.Close()
	if n, err := ours.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("after close_notify: Read = %d, %v; want 0, io.EOF", n, err)
	}
}

// Our server (its config picked per handshake, as identity's is) against
// crypto/tls's client.
func TestRecordLayerServerWithCryptoTLS(t *testing.T) {
	ca := newTestCA(t)
	a, b := tcpPair(t)
	inner := ca.serverConfig(t, "ns", "server")
	outer := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return inner, nil
		},
	}
	ref := referenceTLS(t, a, true, ca.clientConfig(t, "ns", "client"))
	ours := asRecordConn(t, recordHandshake(t, b, false, outer))
	cli := <-ref
	if cli == nil {
		t.FailNow()
	}
	exchange(t, cli, ours, 1<<20, 64<<10)
	exchange(t, ours, cli, 1<<20, 64<<10)
	if inner.KeyLogWriter != nil || inner.SessionTicketsDisabled {
		t.Error("the picked config was modified; it must be cloned")
	}
}

// Our KeyUpdates, every few records and on request, are read by
// crypto/tls; its answer to our request is read by us.
func TestRecordLayerKeyUpdate(t *testing.T) {
	old := keyUpdateRecords
	keyUpdateRecords = 5
	defer func() { keyUpdateRecords = old }()

	a, ccfg, ref := cryptoTLSServer(t)
	ours := asRecordConn(t, recordHandshake(t, a, true, ccfg))
	srv := <-ref
	if srv == nil {
		t.FailNow()
	}
	exchange(t, ours, srv, 40*maxPlaintext, 32<<10)
	if got := ours.sentUpdate.Load(); got < 7 {
		t.Fatalf("sent %d KeyUpdates for 40 records, want one per 5", got)
	}

	// Ask the peer to update: crypto/tls answers with its own KeyUpdate
	// as soon as it reads ours, before the data it sends next.
	secret := ours.in.secret
	ours.wmu.Lock()
	b2, err := ours.sealKeyUpdate(nil, true)
	if err == nil {
		b2 = ours.seal(b2, recordTypeAppData, []byte("x"))
		err = ours.flush(b2)
	}
	ours.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	exchange(t, srv, ours, 1<<20, 64<<10)
	if bytes.Equal(ours.in.secret, secret) {
		t.Fatal("the peer's KeyUpdate did not move our read keys")
	}
}

// Between two record layers: a KeyUpdate that asks for one is answered
// before the answering side's next record.
func TestRecordLayerAnswersKeyUpdate(t *testing.T) {
	ca := newTestCA(t)
	a, b := tcpPair(t)
	srvc := make(chan wire, 1)
	go func() { srvc <- recordHandshake(t, b, false, ca.serverConfig(t, "ns", "server")) }()
	cli := asRecordConn(t, recordHandshake(t, a, true, ca.clientConfig(t, "ns", "client")))
	srv := asRecordConn(t, <-srvc)

	cli.wmu.Lock()
	buf, err := cli.sealKeyUpdate(nil, true)
	if err == nil {
		err = cli.flush(buf)
	}
	cli.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	exchange(t, cli, srv, 100, 100) // srv's reader sees the request
	if !srv.peerAsked.Load() {
		t.Fatal("the request was not noted")
	}
	exchange(t, srv, cli, 1<<20, 1<<20)
	if got := srv.sentUpdate.Load(); got != 1 {
		t.Fatalf("server sent %d KeyUpdates, want 1", got)
	}
	if srv.out.seq > uint64(1<<20/maxPlaintext+1) || cli.in.seq != srv.out.seq {
		t.Fatalf("sequences: server out %d, client in %d; want equal, restarted at the update", srv.out.seq, cli.in.seq)
	}
}

// A changed byte fails authentication and ends the connection.
func TestRecordLayerRejectsTampering(t *testing.T) {
	k := newTestSecret(t)
	w := &recordConn{out: k.keys(t)}
	wire := w.seal(nil, recordTypeAppData, []byte("hello"))
	wire[len(wire)-3] ^= 1
	r := memRecordConn(t, k, wire)
	if _, err := r.Read(make([]byte, 100)); !errors.Is(err, errRecordMAC) {
		t.Fatalf("Read = %v, want %v", err, errRecordMAC)
	}
}

// testSecret is a traffic secret for in-memory record layers.
type testSecret []byte

func newTestSecret(t testing.TB) testSecret {
	s := make([]byte, 32)
	_, _ = rand.Read(s)
	return s
}

func (s testSecret) keys(t testing.TB) *trafficKeys {
	k, err := newTrafficKeys(tls.TLS_AES_128_GCM_SHA256, s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// memRecordConn reads the records in data.
func memRecordConn(t testing.TB, s testSecret, data []byte) *recordConn {
	c := &recordConn{raw: &memConn{r: bytes.NewReader(data)}, in: s.keys(t), out: s.keys(t)}
	c.readFn = c.doRead
	return c
}

type memConn struct {
	net.Conn
	r io.Reader
}

func (c *memConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func TestTrafficKeysSuites(t *testing.T) {
	if _, err := newTrafficKeys(tls.TLS_CHACHA20_POLY1305_SHA256, make([]byte, 32)); !errors.Is(err, errRecordSuite) {
		t.Fatalf("ChaCha20: %v, want %v (crypto/tls keeps such connections)", err, errRecordSuite)
	}
	if _, err := newTrafficKeys(tls.TLS_AES_256_GCM_SHA384, make([]byte, 32)); err == nil {
		t.Fatal("a 32-byte secret was taken for a SHA-384 suite")
	}
	if _, err := newTrafficKeys(tls.TLS_AES_256_GCM_SHA384, make([]byte, 48)); err != nil {
		t.Fatal(err)
	}
}

// discardConn is a net.Conn whose writes go nowhere.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

// aesImpls runs a record benchmark with package aesgcm's assembly (where
// the CPU has it) and with Go's AES-GCM.
func aesImpls(b *testing.B, f func(b *testing.B)) {
	for _, asm := range []bool{true, false} {
		name := "aes=go"
		if asm {
			if !aesgcm.Accelerated() {
				continue
			}
			name = "aes=asm"
		}
		b.Run(name, func(b *testing.B) {
			aesgcm.UseAssembly(asm)
			b.Cleanup(func() { aesgcm.UseAssembly(true) })
			f(b)
		})
	}
}

// BenchmarkRecordWrite seals one maximum-size DATA frame (header and
// payload) per op, without a socket: the record layer's own cost.
func BenchmarkRecordWrite(b *testing.B) { aesImpls(b, benchRecordWrite) }

func benchRecordWrite(b *testing.B) {
	w := &recordConn{raw: discardConn{}, out: newTestSecret(b).keys(b)}
	frame := make([]byte, frameHeaderLen+maxFrameSize)
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Write(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordRead opens one maximum-size DATA frame's records per op
// into a frame-sized buffer, as the connection's reader does.
func BenchmarkRecordRead(b *testing.B) { aesImpls(b, benchRecordRead) }

func benchRecordRead(b *testing.B) {
	s := newTestSecret(b)
	w := &recordConn{raw: discardConn{}, out: s.keys(b)}
	frame := make([]byte, frameHeaderLen+maxFrameSize)
	var wire []byte
	for len(frame) > 0 {
		n := min(len(frame), maxPlaintext)
		wire = w.seal(wire, recordTypeAppData, frame[:n])
		frame = frame[n:]
	}
	r := memRecordConn(b, s, nil)
	src := bytes.NewReader(nil)
	r.raw = &memConn{r: src}
	p := make([]byte, frameHeaderLen+maxFrameSize)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		r.in.seq = 0
		src.Reset(wire)
		if _, err := io.ReadFull(r, p); err != nil {
			b.Fatal(err)
		}
	}
}

// A record that fails authentication, arriving on a serving connection,
// ends it and is counted.
func TestRecordLayerCountsBadRecord(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	raw, err := net.Dial("tcp", e.ln.addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tc := tls.Client(raw, e.ca.clientConfig(t, "client", "cli", spiffeID("server", "srv")))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	// The preface and an empty SETTINGS through TLS, so the server's
	// reader loop is running; then a forged record on the raw socket.
	if _, err := tc.Write(append([]byte(http2.ClientPreface), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	forged := append([]byte{recordTypeAppData, 3, 3, 0, 40}, make([]byte, 40)...)
	if _, err := raw.Write(forged); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forged record counted", func() bool {
		return e.metric(t, "ztunnel_hbone_server_http2_errors_total", "tls_record") == 1
	})
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, raw); err != nil {
		t.Fatalf("the server did not close the connection: %v", err)
	}
}

func TestRecordErrorType(t *testing.T) {
	for err, want := range map[error]string{
		errRecordMAC:                        "tls_record",
		io.ErrUnexpectedEOF:                 "",
		alertErr([]byte{2, 40}):             "tls_alert",
		innerErr([]byte{0, 0}):              "tls_record",
		errors.New("hbone: something else"): "",
	} {
		if got := recordErrorType(err); got != want {
			t.Errorf("recordErrorType(%v) = %q, want %q", err, got, want)
		}
	}
}

func innerErr(inner []byte) error {
	_, _, err := innerContent(inner)
	return err
}

// When the record layer cannot take over (a suite it does not implement,
// simulated by withholding the secrets), crypto/tls carries the
// connection on from where the handshake's bounded reads stopped.
func TestRecordLayerFallsBackToCryptoTLS(t *testing.T) {
	a, ccfg, ref := cryptoTLSServer(t)
	bt := newBatchTLS(a, true, tlsForHBONE(ccfg))
	if err := bt.Handshake(); err != nil {
		t.Fatal(err)
	}
	bt.keys.client = nil
	w := bt.afterHandshake()
	if _, ok := w.(*batchTLS); !ok {
		t.Fatalf("without secrets the connection uses %T, want crypto/tls", w)
	}
	srv := <-ref
	if srv == nil {
		t.FailNow()
	}
	exchange(t, w, srv, 1<<20, 64<<10)
	exchange(t, srv, w, 1<<20, 64<<10)
}

// probeConn serves data, then reports whether the record layer held a
// read buffer when it came back for more (a connection going idle).
type probeConn struct {
	net.Conn
	c    *recordConn
	data []byte
	held bool
}

func (p *probeConn) Read(b []byte) (int, error) {
	if len(p.data) == 0 {
		p.held = p.c.rbuf != nil // same goroutine as the record layer's
		return 0, io.EOF
	}
	n := copy(b, p.data[:min(len(p.data), 7000)]) // records arrive split
	p.data = p.data[n:]
	return n, nil
}

// On a connection that is not a socket (no poller to wait on), the
// record layer still waits for the next record without a read buffer.
func TestRecordLayerIdleHoldsNoBuffer(t *testing.T) {
	s := newTestSecret(t)
	w := &recordConn{out: s.keys(t)}
	var wire []byte
	for range 3 {
		wire = w.seal(wire, recordTypeAppData, make([]byte, maxPlaintext))
	}
	c := memRecordConn(t, s, nil)
	probe := &probeConn{c: c, data: wire}
	c.raw = probe
	if _, err := io.ReadFull(c, make([]byte, 3*maxPlaintext)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("Read at the end = %v, want io.EOF", err)
	}
	if probe.held {
		t.Fatal("a read buffer was held while waiting for the next record")
	}
	if c.rbuf != nil {
		t.Fatal("a read buffer is held after the connection ended")
	}
}
