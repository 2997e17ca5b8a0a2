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
// A new pooled connection waits for the server's SETTINGS (one PING round
// trip) before carrying streams, so streams are sized to the peer's frame
// size and concurrency limit from the start (see poolconn.go). A CONNECT
// that got no response because its connection broke, got GOAWAY or had the
// stream refused is retried on another connection, at most three attempts:
// nothing is sent before the 200, so a retry cannot duplicate data.
//
// # Known limitation: server-side half-close
//
// x/net/http2's server has no half-closed(local) state for handlers: the
// response END_STREAM is written only when the Handler returns, and
// returning also stops reading the request. ServerStream.CloseWrite
// therefore stops reading the request body too (reads then return io.EOF),
// so that a client waiting for EOF is not left hanging; bytes the client
// sends after the upstream half-closed are dropped (RFC 9113 §8.1 lets a
// server end a request this way). Client-side half-close is complete.
//
// # Environment
//
// The package reads no environment variables. internal/config maps
// POOL_MAX_STREAMS_PER_CONNECTION (default 100) and
// POOL_UNUSED_RELEASE_TIMEOUT (default 5m) to PoolOptions. The HTTP/2
// windows are constants (tuning.go): upstream's defaults for
// HTTP2_STREAM_WINDOW_SIZE (4 MiB) and HTTP2_CONNECTION_WINDOW_SIZE
// (16 MiB), but 64 KiB frames instead of upstream's HTTP2_FRAME_SIZE 1 MiB,
// because x/net pins buffers sized to the frame size per stream and per
// connection (measured: 546 KB per idle stream at 1 MiB, 89 KB at 64 KiB).
//
// # Metrics
//
// Pool (PoolOptions.Registerer):
//
//	ztunnel_hbone_pool_connections         gauge    open HBONE client connections
//	ztunnel_hbone_pool_streams             gauge    open client streams
//	ztunnel_hbone_pool_dials_total         counter  {result}: ok, dial, tls_config, tls_handshake, tls_version, http2
//	ztunnel_hbone_pool_http2_errors_total  counter  {type}: x/net/http2 protocol error types
//
// Server (ServerOptions.Registerer):
//
//	ztunnel_hbone_server_connections         gauge    open HBONE server connections
//	ztunnel_hbone_server_streams             gauge    CONNECT streams in a Handler
//	ztunnel_hbone_server_rejects_total       counter  {reason}: method_not_allowed, bad_authority,
//	                                                  tls_handshake, tls_version, conn_rejected,
//	                                                  unanswered, and the Handler's Reject reasons
//	ztunnel_hbone_server_http2_errors_total  counter  {type}: x/net/http2 protocol error types
package hbone
