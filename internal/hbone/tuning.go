package hbone

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"golang.org/x/net/http2"
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

// Write buffering: x/net/http2 has no knob for its write buffers (a 4 KiB
// bufio on both sides); frames larger than that go straight to the TLS
// connection, so the size that matters is the size of each Write: the
// proxy's copy buffer (it grows to 256 KiB for bulk) becomes one DATA frame
// (client) or one handler write (server). crypto/tls then writes every
// 16 KiB record with its own syscall; batch.go gathers them (measured: 72 →
// 8 write syscalls per MiB). On the read side x/net sends a WINDOW_UPDATE
// per ≥ 4 KiB consumed, so large reads by the consumer keep that rate low.

// h2Tuning groups the flow-control settings so benchmarks can compare
// them against x/net's defaults; production always uses defaultTuning.
type h2Tuning struct {
	streamWindow int
	connWindow   int
	maxFrameSize int
	noBatch      bool // write TLS records one syscall each (see batch.go)
}

var defaultTuning = h2Tuning{streamWindow: streamWindow, connWindow: connWindow, maxFrameSize: maxFrameSize}

func tuningOrDefault(t *h2Tuning) h2Tuning {
	if t == nil {
		return defaultTuning
	}
	return *t
}

// newTransport builds the client HTTP/2 transport shared by all connections
// of a Pool. The http.Transport exists only to carry the HTTP2Config: x/net
// reads window sizes from it and from nowhere else.
func newTransport(tu h2Tuning, countError func(string)) (*http2.Transport, error) {
	t1 := &http.Transport{HTTP2: &http.HTTP2Config{
		MaxReceiveBufferPerConnection: tu.connWindow,
		MaxReceiveBufferPerStream:     tu.streamWindow,
		MaxReadFrameSize:              tu.maxFrameSize,
		SendPingTimeout:               pingInterval,
		PingTimeout:                   pingTimeout,
		CountError:                    countError,
	}}
	t2, err := http2.ConfigureTransports(t1)
	if err != nil {
		return nil, fmt.Errorf("hbone: configure http2 transport: %w", err)
	}
	t2.MaxHeaderListSize = clientMaxHeaderList
	t2.MaxReadFrameSize = uint32(tu.maxFrameSize)
	t2.ReadIdleTimeout = pingInterval
	t2.PingTimeout = pingTimeout
	t2.CountError = countError
	// No Accept-Encoding: gzip on CONNECT requests.
	t2.DisableCompression = true
	return t2, nil
}

// newH2Server builds the HTTP/2 server and the http.Server that carries its
// base configuration (header limit, error log, graceful-shutdown hook).
func newH2Server(tu h2Tuning, maxStreams uint32, countError func(string), log *slog.Logger) (*http2.Server, *http.Server, error) {
	h2 := &http2.Server{
		MaxConcurrentStreams:         maxStreams,
		MaxReadFrameSize:             uint32(tu.maxFrameSize),
		MaxUploadBufferPerConnection: int32(tu.connWindow),
		MaxUploadBufferPerStream:     int32(tu.streamWindow),
		ReadIdleTimeout:              pingInterval,
		PingTimeout:                  pingTimeout,
		CountError:                   countError,
	}
	hs := &http.Server{
		MaxHeaderBytes: serverMaxHeaderBytes,
		// x/net logs through ErrorLog, or the global log package without it.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	// ConfigureServer registers the hook through which hs.Shutdown sends
	// GOAWAY on every connection served by h2.
	if err := http2.ConfigureServer(hs, h2); err != nil {
		return nil, nil, fmt.Errorf("hbone: configure http2 server: %w", err)
	}
	return h2, hs, nil
}

// tlsForHBONE returns cfg, or a clone of it, that offers ALPN "h2" and
// requires TLS 1.3. It clones only when cfg lacks either, so a caller that
// caches a correct config pays nothing.
func tlsForHBONE(cfg *tls.Config) *tls.Config {
	if cfg.MinVersion >= tls.VersionTLS13 && slices.Contains(cfg.NextProtos, http2.NextProtoTLS) {
		return cfg
	}
	c := cfg.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	if !slices.Contains(c.NextProtos, http2.NextProtoTLS) {
		c.NextProtos = append([]string{http2.NextProtoTLS}, c.NextProtos...)
	}
	return c
}
