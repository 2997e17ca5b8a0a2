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

// HTTP/2 settings. A tunnel carries long bulk transfers beside small
// requests, so each value here is chosen on purpose; benchmarks in
// bench_test.go show the effect.
const (
	// streamWindow is the per-stream receive window (upstream
	// HTTP2_STREAM_WINDOW_SIZE). It bounds one stream's throughput to
	// window/RTT: 4 MiB at a 1 ms cross-node RTT is ~33 Gbit/s, at 10 ms
	// ~3.3 Gbit/s. Received data waits in pooled chunks only while the
	// destination cannot take it, so an idle stream costs nothing; only a
	// stream whose reader falls behind holds up to this much.
	streamWindow = 4 << 20

	// connWindow is the connection receive window (upstream
	// HTTP2_CONNECTION_WINDOW_SIZE): four stream windows, so one stalled
	// stream (its reader gone quiet) can never take the whole connection
	// window and starve the other streams multiplexed on it.
	connWindow = 16 << 20

	// streamUpdateEvery is how many consumed bytes of a stream make a
	// WINDOW_UPDATE (upstream's h2: half a window, 2 MiB). 128 KiB keeps
	// the burst a slow reader's sender makes of each update as small as
	// what TCP_NOTSENT_LOWAT lets queue; measured: head-of-line p99 beside
	// a 16 MiB/s slow-reader stream 4.9/3.7 → 2.7/2.2 ms, and
	// BenchmarkThroughput unchanged within noise (CPU per MiB 1.26-1.65 vs
	// 1.32-1.54 ms; 7 more small writes per MiB).
	streamUpdateEvery = 128 << 10

	// streamUpdateKeepingUp is the batch while the stream's reader keeps
	// up, seen as the sender still holding over half its window, so the
	// window does not hold it back: a quarter window, as often as
	// upstream's h2 updates a connection window. At 128 KiB a bulk stream cost each ztunnel ~8 000 syscalls
	// per GB for updates alone (the receiver's writes, the sender's reads
	// and wake-ups).
	streamUpdateKeepingUp = streamWindow / 4

	// maxFrameSize is the largest frame we accept (SETTINGS_MAX_FRAME_SIZE),
	// so the largest DATA frame the peer sends us; a sender reads at most
	// this much from its socket at once (and never more than maxReadSize).
	// Upstream's default (HTTP2_FRAME_SIZE) is 1 MiB. 256 KiB, the largest
	// pooled buffer, halves the syscalls and wake-ups per byte of 64 KiB
	// (reads and writes of the pod sockets are a frame each): in the bench
	// (-quick, hbone-cross-node, two ztunnel processes) 1-stream throughput
	// went 2.35-3.43 → 2.99-4.73 Gbit/s (6 of 7 pairs faster) with the
	// slow-reader head-of-line ratio unchanged within its noise; a
	// slow-reader stream is window-limited to 128 KiB bursts anyway. An
	// in-process benchmark (one Go scheduler for both ends) had favoured
	// 64 KiB. The reader holds a frame in a pooled buffer only while it
	// is forwarded.
	maxFrameSize = 256 << 10

	// pingInterval and pingTimeout detect a dead peer on an otherwise quiet
	// connection (upstream: ping every 10s, give up after 20s). Only a
	// connection that received nothing for pingInterval is pinged, so busy
	// connections pay nothing.
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

// notSentLowat bounds the bytes the kernel holds unsent (TCP_NOTSENT_LOWAT)
// in two kinds of socket.
//
// An HBONE connection's: without it a bulk stream fills the socket's send
// buffer (megabytes with autotuning) and every small frame of another
// stream waits behind all of it: head-of-line blocking the HTTP/2 layer
// cannot see. With it, writes wait in user space, where maxPending
// interleaves streams frame by frame. 128 KiB still keeps a fast link busy.
//
// A socket a stream's bytes are delivered to (CopyTo's sink, the proxy's
// socket towards a workload), once it has filled up: behind a slow
// reader, what may wait unsent in that socket is how far ahead of the
// reader the stream is drained, and each drained byte returns window to
// the sender. With the kernel's own bound — a writer woken once a third
// of a multi-megabyte buffer is free — the stream drains in ~0.5 MiB
// steps, and each step comes back as a burst that every other stream on
// the shared connection waits behind. Traced in the bench's head-of-line
// phase (a 16 MiB/s reader): ~560 KiB every ~35 ms before, ~320 KiB every
// ~20 ms with this bound; the bench's moving turns' p99 was 1.07-1.26 ms
// without it and 0.65-0.93 ms with it (three ways of setting it, fifteen
// alternating pairs of runs, lower in every pair). Not from the
// start: a reader that keeps up never fills the buffer, and bounding its
// socket only adds wake-ups (bounded at once, or once a stream had moved
// 128 KiB: 1- and 8-stream throughput 5 % and 7 % lower over ten
// alternating runs; bounded once full: unchanged), and the many short
// connections would pay a syscall for nothing.
const notSentLowat = 128 << 10

// tuneSocket sets the socket options of an HBONE TCP connection. Failures
// are ignored: they cost fairness, not correctness.
func tuneSocket(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	if rc, err := sc.SyscallConn(); err == nil {
		boundUnsent(rc)
	}
}

// boundUnsent sets TCP_NOTSENT_LOWAT to notSentLowat on rc, ignoring
// failures (rc is not a TCP socket) as tuneSocket does.
func boundUnsent(rc syscall.RawConn) {
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
