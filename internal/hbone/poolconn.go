package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// poolConn is one pooled HTTP/2 connection.
type poolConn struct {
	// Immutable after newConn.
	key    Key
	cc     *http2.ClientConn
	tls    *tls.ConnectionState
	local  net.Addr
	remote net.Addr

	// peerMax is the peer's MAX_CONCURRENT_STREAMS seen at setup (0 if
	// unknown); settled is set once limit reflects the peer's SETTINGS.
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
	kc := p.keys[key]
	if kc != nil {
		for i, x := range kc.dials {
			if x == d {
				kc.dials = append(kc.dials[:i], kc.dials[i+1:]...)
				break
			}
		}
	}
	if err == nil && p.closed {
		_ = c.cc.Close()
		c, err = nil, ErrPoolClosed
	}
	if err == nil {
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
	var tc *tls.Conn
	var h2conn net.Conn
	if p.batch {
		bt := newBatchTLS(raw, true, tlsForHBONE(cfg))
		tc, h2conn = bt.Conn, bt
	} else {
		tc = tls.Client(raw, tlsForHBONE(cfg))
		h2conn = tc
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return fail(ReasonTLSHandshake, err)
	}
	st := tc.ConnectionState()
	if st.Version != tls.VersionTLS13 || st.NegotiatedProtocol != http2.NextProtoTLS {
		_ = tc.Close()
		return fail(ReasonTLSVersion, fmt.Errorf("negotiated version %#x, ALPN %q; want TLS 1.3, h2", st.Version, st.NegotiatedProtocol))
	}
	cc, err := p.h2.NewClientConn(h2conn)
	if err != nil {
		_ = tc.Close()
		return fail(ReasonHTTP2, err)
	}
	// Wait for the server's SETTINGS (its PING ack comes after them). This
	// costs one round trip per new connection and buys three things:
	//   - x/net sizes a stream's DATA frames from the peer's max frame size
	//     known when the stream starts; before SETTINGS that is 16 KiB, and
	//     the first streams of a connection would keep 16 KiB frames (two
	//     TLS records, two syscalls each) for their whole life;
	//   - the peer's MAX_CONCURRENT_STREAMS is known before coalesced
	//     waiters are assigned to the connection;
	//   - a server that refuses our certificate after a TLS 1.3 handshake
	//     (it checks after the client is done) fails the dial, not a stream.
	if err := cc.Ping(ctx); err != nil {
		_ = cc.Close()
		var alert tls.AlertError
		if errors.As(err, &alert) {
			return fail(ReasonTLSHandshake, err)
		}
		return fail(ReasonHTTP2, err)
	}
	c := &poolConn{key: key, cc: cc, tls: &st, local: tc.LocalAddr(), remote: tc.RemoteAddr()}
	if peer := int(cc.State().MaxConcurrentStreams); peer > 0 {
		c.peerMax = peer
		c.settled.Store(true)
	}
	p.metrics.dial(resultOK)
	p.log.Debug("hbone: new connection", "key", key.String(), "local", tc.LocalAddr().String(), "peer_max_streams", c.peerMax)
	return c, nil
}

// open sends the CONNECT on c, whose slot the caller reserved. retry
// reports whether the request got no answer and may go to another
// connection.
func (p *Pool) open(ctx context.Context, c *poolConn, authority string, hdr http.Header) (s *Stream, retry bool, err error) {
	pr, pw := io.Pipe()
	// The request context is the stream's lifetime, not ctx: cancelling it
	// resets the stream. ctx is linked to it only until the response.
	reqCtx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(reqCtx, http.MethodConnect, "", pr)
	if err != nil {
		cancel()
		p.release(c)
		return nil, false, fmt.Errorf("hbone: CONNECT %s: %w", authority, err)
	}
	req.Host = authority
	req.URL.Host = authority
	req.Header = hdr

	stop := context.AfterFunc(ctx, cancel)
	resp, err := c.cc.RoundTrip(req)
	if !stop() && err == nil {
		// ctx ended just as the answer came; the stream is already reset.
		_ = resp.Body.Close()
		err = ctx.Err()
	}
	p.learnLimit(c)
	if err != nil {
		_ = pw.CloseWithError(err)
		cancel()
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		retry = ctx.Err() == nil && retryable(err)
		if st := c.cc.State(); st.Closed || st.Closing {
			p.mu.Lock()
			p.retireLocked(c)
			p.mu.Unlock()
		}
		p.release(c)
		return nil, retry, fmt.Errorf("hbone: CONNECT %s via %s: %w", authority, c.key.Addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		_ = pw.Close()
		cancel()
		p.release(c)
		return nil, false, &StatusError{Code: resp.StatusCode}
	}
	return &Stream{
		pool:   p,
		conn:   c,
		body:   resp.Body,
		pw:     pw,
		cancel: cancel,
		header: resp.Header,
	}, false, nil
}

// retryable reports whether a CONNECT that failed with err before any
// response may be sent again on another connection. That is every failure
// but a cancelled context: the connection broke or got GOAWAY, or the
// server reset the stream (REFUSED_STREAM, or x/net's PROTOCOL_ERROR when
// a stream raced the peer's lower MAX_CONCURRENT_STREAMS). No payload goes
// out before the 200, so a retry cannot duplicate data; the attempts are
// bounded by maxConnectAttempts.
func retryable(err error) bool {
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// learnLimit caps c's stream limit by the peer's MAX_CONCURRENT_STREAMS
// once its SETTINGS arrived, and remembers it for the key's next dials.
func (p *Pool) learnLimit(c *poolConn) {
	if c.settled.Load() {
		return
	}
	peer := int(c.cc.State().MaxConcurrentStreams)
	if peer == 0 {
		return // SETTINGS not seen yet
	}
	p.mu.Lock()
	c.limit = min(p.maxStreams, peer)
	if kc := p.keys[c.key]; kc != nil {
		kc.peerMax = peer
	}
	p.mu.Unlock()
	c.settled.Store(true)
}
