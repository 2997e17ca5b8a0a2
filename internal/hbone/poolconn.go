package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// poolConn is one pooled HTTP/2 connection.
type poolConn struct {
	// Immutable after newConn.
	key    Key
	h      *conn
	tls    *tls.ConnectionState
	local  net.Addr
	remote net.Addr

	// peerMax is the peer's MAX_CONCURRENT_STREAMS seen at setup (0 if
	// it set none); settled is set once limit reflects it.
	peerMax int
	settled atomic.Bool

	// Guarded by Pool.mu.
	streams int         // slots reserved by Connect, released by Stream.Close
	limit   int         // max concurrent streams: ours, capped by the peer's
	retired bool        // removed from its key; closed when streams reach 0
	idle    *time.Timer // running while streams == 0
	idleSeq uint64      // identifies the current idle timer
}

func (c *poolConn) stopIdleLocked() {
	if c.idle != nil {
		c.idle.Stop()
		c.idle = nil
	}
}

// dialConn sets up a connection for d and hands it to d's claimers.
func (p *Pool) dialConn(key Key, d *pendingDial) {
	defer p.wg.Done()
	c, err := p.newConn(key)

	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && p.closed {
		// Closing runs onClose, which takes mu: not under it.
		p.mu.Unlock()
		c.h.close(ErrPoolClosed)
		p.mu.Lock()
		c, err = nil, ErrPoolClosed
	}
	kc := p.keys[key]
	if kc != nil {
		for i, x := range kc.dials {
			if x == d {
				kc.dials = append(kc.dials[:i], kc.dials[i+1:]...)
				break
			}
		}
	}
	// A connection that closed between its setup and here was retired by
	// connClosed before it was ever linked: linking it now would leave a
	// dead connection among kc.conns. Its claimers see it closed and dial
	// again.
	if err == nil && !c.retired {
		if kc == nil {
			kc = &keyConns{}
			p.keys[key] = kc
		}
		if c.peerMax > 0 {
			kc.peerMax = c.peerMax
		}
		c.limit = p.dialCapacityLocked(kc)
		kc.conns = append(kc.conns, c)
		p.all[c] = struct{}{}
		p.metrics.connDelta(1)
		// Claimers stop this as they reserve; if they all gave up, the
		// connection idles out like any other.
		p.armIdleLocked(c)
	} else if kc != nil && len(kc.conns) == 0 && len(kc.dials) == 0 {
		delete(p.keys, key)
	}
	d.conn, d.err = c, err
	close(d.done)
}

// newConn dials, handshakes TLS 1.3 with ALPN h2, and starts HTTP/2.
func (p *Pool) newConn(key Key) (*poolConn, error) {
	addr := key.Addr.String()
	fail := func(reason string, err error) (*poolConn, error) {
		p.metrics.dial(reason)
		p.log.Debug("hbone: new connection failed", "key", key.String(), "reason", reason, "error", err)
		return nil, &ConnectError{Reason: reason, Addr: addr, Err: err}
	}
	cfg, err := p.tlsFor(key)
	if err == nil && cfg == nil {
		err = errors.New("no TLS config")
	}
	if err != nil {
		return fail(ReasonTLSConfig, err)
	}
	ctx, cancel := context.WithTimeout(p.ctx, connectTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, keyContextKey{}, key)

	raw, err := p.dial(ctx, "tcp", addr)
	if err != nil {
		return fail(ReasonDial, err)
	}
	tuneSocket(raw)
	bt := newBatchTLS(raw, true, tlsForHBONE(cfg))
	if err := bt.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return fail(ReasonTLSHandshake, err)
	}
	st := bt.ConnectionState()
	if st.Version != tls.VersionTLS13 || st.NegotiatedProtocol != http2.NextProtoTLS {
		_ = raw.Close()
		return fail(ReasonTLSVersion, fmt.Errorf("negotiated version %#x, ALPN %q; want TLS 1.3, h2", st.Version, st.NegotiatedProtocol))
	}
	c := &poolConn{key: key, tls: &st, local: raw.LocalAddr(), remote: raw.RemoteAddr()}
	c.h = newConn(bt.afterHandshake(), connOptions{
		client:     true,
		log:        p.log,
		countError: p.metrics.countError,
		onClose:    func(*conn) { p.connClosed(c) },
	})
	if p.testHookPreface != nil {
		p.testHookPreface()
	}
	// The preface goes out before the reader starts. A server may send its
	// SETTINGS as soon as its side of the handshake is done (upstream's
	// does); a reader already running would answer them with a SETTINGS
	// ACK that could reach the socket ahead of the preface, and the server
	// closes a connection whose first bytes are not the preface.
	err = c.h.startClient()
	if err == nil {
		go c.h.readLoop()
		// Wait for the server's SETTINGS: one round trip per new
		// connection that buys three things: streams start with the
		// peer's frame size and windows; the peer's
		// MAX_CONCURRENT_STREAMS is known before coalesced waiters are
		// assigned to the connection; and a server that refuses our
		// certificate after a TLS 1.3 handshake (it checks after the
		// client is done) fails the dial, not a stream.
		err = c.h.waitSettings(ctx.Done())
	}
	if err != nil {
		c.h.close(err)
		var alert tls.AlertError
		if errors.As(err, &alert) {
			return fail(ReasonTLSHandshake, err)
		}
		return fail(ReasonHTTP2, c.h.setupErr(err))
	}
	c.h.startKeepalive()
	if peer := c.h.maxConcurrent(); peer > 0 {
		c.peerMax = peer
	}
	c.settled.Store(true)
	p.metrics.dial(resultOK)
	p.log.Debug("hbone: new connection", "key", key.String(), "local", c.local.String(), "peer_max_streams", c.peerMax)
	return c, nil
}

// connClosed retires c when its HTTP/2 connection ended underneath it.
func (p *Pool) connClosed(c *poolConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retireLocked(c)
}

// open sends the CONNECT on c, whose slot the caller reserved. retry
// reports whether the request got no answer and may go to another
// connection.
func (p *Pool) open(ctx context.Context, c *poolConn, authority string, hdr *ConnectHeader) (s *Stream, retry bool, err error) {
	var early []byte
	if hdr != nil {
		early = hdr.Early
	}
	hs, sent, err := c.h.openStream(connectFields(authority, hdr), early)
	if err == nil {
		select {
		case <-hs.respc:
			err = hs.respErr
		case <-ctx.Done():
			err = ctx.Err()
			hs.resetWith(http2.ErrCodeCancel, false, err)
		}
		if err != nil {
			c.h.removeStream(hs)
		}
	}
	if err != nil {
		retry = ctx.Err() == nil && retryable(err)
		if c.h.closing() {
			p.mu.Lock()
			p.retireLocked(c)
			p.mu.Unlock()
		}
		p.release(c)
		return nil, retry, fmt.Errorf("hbone: CONNECT %s via %s: %w", authority, c.key.Addr, err)
	}
	// drop gives up an answered stream: its slot goes back to the pool.
	drop := func(err error) {
		hs.resetWith(http2.ErrCodeCancel, false, err)
		c.h.removeStream(hs)
		p.release(c)
	}
	if hs.status != http.StatusOK {
		drop(net.ErrClosed)
		return nil, false, &StatusError{Code: hs.status}
	}
	if len(early) > 0 && !sent {
		// The windows were short at the CONNECT: send it now, as any
		// write would, before the caller's own bytes.
		if _, err := hs.write(early); err != nil {
			drop(err)
			return nil, false, fmt.Errorf("hbone: CONNECT %s via %s: sending its first bytes: %w", authority, c.key.Addr, err)
		}
	}
	return &Stream{h2stream: hs, pool: p, conn: c, header: hs.header}, false, nil
}

// connectFields are the CONNECT request's header fields: :method and
// :authority (RFC 9113 §8.5: no :scheme or :path), then h's set fields,
// then h.Extra in lower case, without hop-by-hop fields.
func connectFields(authority string, h *ConnectHeader) []hpack.HeaderField {
	f := make([]hpack.HeaderField, 0, 5)
	f = append(f, hpack.HeaderField{Name: ":method", Value: http.MethodConnect}, hpack.HeaderField{Name: ":authority", Value: authority})
	if h == nil {
		return f
	}
	for _, kv := range [...]struct{ name, value string }{
		{HeaderForwarded, h.Forwarded},
		{HeaderTraceparent, h.Traceparent},
		{HeaderBaggage, h.Baggage},
	} {
		if kv.value != "" {
			f = append(f, hpack.HeaderField{Name: kv.name, Value: kv.value})
		}
	}
	return appendHeader(f, h.Extra)
}

func appendHeader(f []hpack.HeaderField, hdr http.Header) []hpack.HeaderField {
	for k, vs := range hdr {
		name := strings.ToLower(k)
		switch name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host", "te":
			continue
		}
		for _, v := range vs {
			f = append(f, hpack.HeaderField{Name: name, Value: v})
		}
	}
	return f
}

// retryable reports whether a CONNECT that failed with err before any
// response may be sent again on another connection. That is every failure
// but a cancelled context: the connection broke or got GOAWAY, or the
// server refused the stream. No payload goes out before the 200, so a
// retry cannot duplicate data; the attempts are bounded by
// maxConnectAttempts.
func retryable(err error) bool {
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
