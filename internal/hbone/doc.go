// Package hbone carries TCP streams as HTTP/2 CONNECT streams over mutual
// TLS 1.3 ("HBONE", port 15008 in Istio ambient).
//
// It owns two things:
//
//   - Pool, the client side: one HTTP/2 connection per Key (source
//     identity, accepted destination identities, destination address),
//     each carrying up to PoolOptions.MaxStreamsPerConn concurrent streams
//     (never more than the peer's SETTINGS_MAX_CONCURRENT_STREAMS). When
//     every connection of a key is full another one is opened; concurrent
//     first dials for a key coalesce; idle connections are closed after
//     PoolOptions.IdleTimeout; connections that received GOAWAY or broke
//     are retired and new streams go to a new connection.
//   - Server, the server side: TLS handshake, HTTP/2 serving, CONNECT
//     validation, and a per-stream Handler that decides (after dialing its
//     upstream and authorizing) whether to Accept (200) or Reject.
//
// The package does no authorization and no certificate management: the
// caller supplies *tls.Config values that verify the peer (SPIFFE), and
// reads the peer certificates from Request.TLS to authorize.
//
// # Message sequence
//
//	client                                         server (15008)
//	TCP connect, TLS 1.3 handshake, ALPN "h2", both sides present certs
//	HTTP/2 preface + SETTINGS       ───────────▶
//	                                ◀───────────   SETTINGS (MAX_CONCURRENT_STREAMS, windows)
//	HEADERS :method CONNECT
//	        :authority <dst ip:port>
//	        baggage, forwarded, traceparent ───▶  Handler(ctx, *Request)
//	                                               (dial upstream, authorize)
//	                                ◀───────────   HEADERS :status 200   (Accept)
//	                                               or :status 4xx/5xx + END_STREAM (Reject)
//	DATA ... (END_STREAM = half-close) ◀──────▶   DATA ... (END_STREAM when the Handler returns)
//	RST_STREAM = abort, in either direction
//	                                ◀───────────   GOAWAY (Server.Shutdown): no new streams;
//	                                               the pool opens a new connection
//
// The header names and formats follow upstream ztunnel: "baggage"
// (k8s.*.name=..., service.name=...), "forwarded" (for="ip:port";host=svc),
// "traceparent" (W3C, 00-<32 hex>-<16 hex>-00) and, for double HBONE,
// "x-forwarded-network". See headers.go.
//
// # Implementation
//
// The HTTP/2 layer is this package's own, built on x/net/http2's Framer
// (frame encoding, validation, CONTINUATION assembly) and hpack, not on
// http2.Transport/Server, whose per-stream pipes, scratch buffers and
// writer goroutines cost a goroutine hand-off (a thread wake-up, tens of
// µs on a VM) per write and ~90 KB per idle stream (see conn.go):
//
//   - one reader goroutine per connection; DATA is written straight into
//     the destination socket from it when that does not block
//     (h2stream.onData), so a proxied request crosses no goroutine;
//   - no writer goroutine: the goroutine that finds the writer free writes
//     its frame itself (the reader too, for its few control frames, when
//     the socket has room); small frames of others arriving meanwhile are
//     coalesced into its next write (at most maxPending bytes), larger ones
//     (bulk DATA) wait for the write to end and are written by their own
//     goroutine, uncopied, so a bulk stream gets at most one frame ahead of
//     a small one; a write goes out as one syscall for all its TLS records;
//   - TLS: crypto/tls does the handshake; then the connection seals and
//     opens its TLS 1.3 records itself (record.go, keys from crypto/tls's
//     key log, recordkeys.go): records are sealed straight into the write's
//     buffer and opened straight into the reader's, a read takes all the
//     socket has; AES-GCM is package aesgcm's (VAES assembly on AVX-512
//     CPUs, about 1.7 times Go's speed here). A suite it does not
//     implement (ChaCha20, chosen only without AES hardware) stays on
//     crypto/tls (batch.go);
//   - an idle stream holds no buffer; a proxied connection idles with one
//     parked goroutine (Stream.CopyFrom) and none for the other direction
//     (StartCopyTo);
//   - socket reads and writes use RawSyscall through the poller (rawio.go)
//     so they do not wake the runtime's sysmon thread.
//
// Flow control is upstream's: 4 MiB stream and 16 MiB connection windows,
// a stream WINDOW_UPDATE per 128 KiB consumed and a connection one per
// quarter window (tuning.go). A stream that stops consuming holds at most
// its window in memory.
//
// A new pooled connection waits for the server's SETTINGS (one round trip)
// before carrying streams, so streams start with the peer's frame size and
// concurrency limit (see poolconn.go). A CONNECT that got no response
// because its connection broke, got GOAWAY or had the stream refused is
// retried on another connection, at most three attempts: nothing is sent
// before the 200, so a retry cannot duplicate data.
//
// Both sides support half-close fully: CloseWrite sends END_STREAM and
// reading goes on until the peer's END_STREAM. Closing a stream whose peer
// is still sending resets it (NO_ERROR after a complete response, else
// CANCEL), as closing a TCP socket with unread data does.
//
// # Environment
//
// The package reads no environment variables. internal/config maps
// POOL_MAX_STREAMS_PER_CONNECTION (default 100) and
// POOL_UNUSED_RELEASE_TIMEOUT (default 5m) to PoolOptions. The HTTP/2
// windows are constants (tuning.go): upstream's defaults for
// HTTP2_STREAM_WINDOW_SIZE (4 MiB) and HTTP2_CONNECTION_WINDOW_SIZE
// (16 MiB), but 64 KiB frames instead of upstream's HTTP2_FRAME_SIZE 1 MiB
// (measured: 256 KiB frames cut write syscalls per MiB from 17 to 7 but
// moved fewer bytes per second, since a frame is forwarded only once it
// has been read whole).
//
// # Metrics
//
// Pool (PoolOptions.Registerer):
//
//	ztunnel_hbone_pool_connections         gauge    open HBONE client connections
//	ztunnel_hbone_pool_streams             gauge    open client streams
//	ztunnel_hbone_pool_dials_total         counter  {result}: ok, dial, tls_config, tls_handshake, tls_version, http2
//	ztunnel_hbone_pool_http2_errors_total  counter  {type}: HTTP/2 errors seen (conn_<CODE>, stream_<CODE>,
//	                                                goaway_<CODE>, refused_stream, ping_timeout), and
//	                                                the TLS records under them: tls_record (failed
//	                                                authentication or broke TLS 1.3's rules), tls_alert
//
// Server (ServerOptions.Registerer):
//
//	ztunnel_hbone_server_connections         gauge    open HBONE server connections
//	ztunnel_hbone_server_streams             gauge    CONNECT streams in a Handler
//	ztunnel_hbone_server_rejects_total       counter  {reason}: method_not_allowed, bad_authority,
//	                                                  headers_too_large, tls_handshake, tls_version,
//	                                                  conn_rejected, bad_preface,
//	                                                  unanswered, and the Handler's Reject reasons
//	ztunnel_hbone_server_http2_errors_total  counter  {type}: as the pool's
package hbone
