package hbone

import (
	"crypto/tls"
	"net"
	"slices"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
)

// HTTP/2 settings. x/net/http2's defaults are chosen for web traffic
// (client: 4 MiB stream / 1 GiB connection window, 16 KiB frames; server:
// 1 MiB windows); a tunnel carries long bulk transfers, so each value here
// is chosen on purpose. Benchmarks in bench_test.go show the effect.
const (
	// streamWindow is the per-stream receive window (upstream
	// HTTP2_STREAM_WINDOW_SIZE). It bounds one stream's throughput to
	// window/RTT: 4 MiB at a 1 ms cross-node RTT is ~33 Gbit/s, at 10 ms
	// ~3.3 Gbit/s. x/net buffers received data in small chunks allocated as
	// it arrives, so an idle stream costs nothing; only a stream whose reader
	// falls behind holds up to this much.
	streamWindow = 4 << 20

	// connWindow is the connection receive window (upstream
	// HTTP2_CONNECTION_WINDOW_SIZE): four stream windows, so one stalled
	// stream (its reader gone quiet) can never take the whole connection
	// window and starve the other streams multiplexed on it.
	connWindow = 16 << 20

	// maxFrameSize is the largest frame we accept (SETTINGS_MAX_FRAME_SIZE),
	// so the largest DATA frame the peer sends us. Upstream's default
	// (HTTP2_FRAME_SIZE) is 1 MiB; we chose 64 KiB on measurement: on
	// loopback it moved as many or more bytes per second and CPU-second as
	// 256 KiB and 1 MiB frames (bench_test.go), a frame still spans only
	// one batched write (batch.go), and it bounds memory: x/net's framer
	// keeps a read buffer as large as the largest frame it ever received,
	// for the life of the connection, so 1 MiB frames would pin up to 1 MiB
	// per idle connection that once carried bulk traffic. x/net's 16 KiB
	// default costs a write syscall per 16 KiB.
	maxFrameSize = 64 << 10

	// pingInterval and pingTimeout detect a dead peer on an otherwise quiet
	// connection (upstream: ping every 10s, give up after 20s). x/net only
	// pings when nothing was received for pingInterval, so busy connections
	// pay nothing.
	pingInterval = 10 * time.Second
	pingTimeout  = 20 * time.Second

	// clientMaxHeaderList and serverMaxHeaderBytes bound the header block a
	// peer may send (upstream: 16 KiB client, 64 KiB server). CONNECT
	// carries a handful of short headers; anything bigger is abuse.
	clientMaxHeaderList  = 16 << 10
	serverMaxHeaderBytes = 64 << 10

	// connectTimeout bounds TCP connect + TLS handshake + HTTP/2 preface of
	// a new pooled connection (upstream CONNECTION_TIMEOUT, 10s).
	connectTimeout = 10 * time.Second

	// handshakeTimeout bounds the server's TLS handshake, so a peer that
	// connects and says nothing cannot hold a connection slot.
	handshakeTimeout = 10 * time.Second

	// DefaultMaxStreamsPerConn is upstream's POOL_MAX_STREAMS_PER_CONNECTION
	// default (Go's and the spec's recommended minimum are also 100).
	DefaultMaxStreamsPerConn = 100

	// DefaultIdleTimeout is upstream's POOL_UNUSED_RELEASE_TIMEOUT default.
	DefaultIdleTimeout = 5 * time.Minute

	// DefaultServerMaxConcurrentStreams is upstream's inbound limit (hyper's
	// default). It is above the client pool's 100 so a ztunnel peer is never
	// refused by the limit before its own pool would open a new connection.
	DefaultServerMaxConcurrentStreams = 200
)

// notSentLowat bounds the bytes the kernel holds unsent in an HBONE
// socket (TCP_NOTSENT_LOWAT). Without it a bulk stream fills the socket's
// send buffer (megabytes with autotuning) and every small frame of another
// stream waits behind all of it: head-of-line blocking the HTTP/2 layer
// cannot see. With it, writes wait in user space, where maxPending
// interleaves streams frame by frame. 128 KiB still keeps a fast link busy.
const notSentLowat = 128 << 10

// tuneSocket sets the socket options of an HBONE TCP connection. Failures
// are ignored: they cost fairness, not correctness.
func tuneSocket(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, notSentLowat)
	})
}

// tlsForHBONE returns cfg, or a clone of it, that offers ALPN "h2",
// requires TLS 1.3 and sends full-size records from the first byte. It
// clones only when cfg lacks any of these, so a caller that caches a
// correct config pays nothing per connection.
func tlsForHBONE(cfg *tls.Config) *tls.Config {
	if cfg.MinVersion >= tls.VersionTLS13 && slices.Contains(cfg.NextProtos, http2.NextProtoTLS) && cfg.DynamicRecordSizingDisabled {
		return cfg
	}
	c := cfg.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	if !slices.Contains(c.NextProtos, http2.NextProtoTLS) {
		c.NextProtos = append([]string{http2.NextProtoTLS}, c.NextProtos...)
	}
	// crypto/tls starts a connection with small records to cut web page
	// latency; a tunnel would pay a record (and a syscall) per ~1 KiB.
	c.DynamicRecordSizingDisabled = true
	return c
}
