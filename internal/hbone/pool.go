package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolOptions configure a Pool.
type PoolOptions struct {
	// Dial opens the TCP connection for a new HBONE connection; the Key is
	// in the context (KeyFromContext). nil uses a net.Dialer. The caller
	// passes one that sets SO_MARK (and binds Key.SrcAddr if it spoofs).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS returns the client TLS config for a new connection to key: our
	// certificate for key.Src and verification of the peer against
	// key.Dst. Called once per new connection, never per stream. Required.
	// The pool adds ALPN "h2" and MinVersion TLS 1.3 if missing.
	TLS func(key Key) (*tls.Config, error)
	// MaxStreamsPerConn caps concurrent streams on one connection; 0 means
	// DefaultMaxStreamsPerConn. The peer's SETTINGS_MAX_CONCURRENT_STREAMS
	// caps it further.
	MaxStreamsPerConn int
	// IdleTimeout closes a connection that has had no streams for this
	// long; 0 means DefaultIdleTimeout, negative never.
	IdleTimeout time.Duration
	// Logger may be nil (discard).
	Logger *slog.Logger
	// Registerer may be nil (no metrics).
	Registerer prometheus.Registerer
}

// maxConnectAttempts bounds how often Connect retries a CONNECT that got no
// response (connection broke, GOAWAY, REFUSED_STREAM) or whose new
// connection the peer closed before its first stream. Retrying is safe:
// no payload is sent before the 200, so the server saw at most a request.
const maxConnectAttempts = 3

// Pool is the HBONE client: a set of HTTP/2 connections keyed by Key, each
// multiplexing CONNECT streams. It is safe for concurrent use.
type Pool struct {
	// Immutable after NewPool.
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	tlsFor      func(Key) (*tls.Config, error)
	maxStreams  int
	idleTimeout time.Duration
	log         *slog.Logger
	metrics     *poolMetrics
	ctx         context.Context // cancelled by Close: bounds dials
	cancel      context.CancelFunc
	wg          sync.WaitGroup // dial goroutines and idle shutdowns

	// testHookClaim, if set, runs (with mu held) when a Connect waits on
	// a dial another Connect started. Tests only.
	testHookClaim func()
	// testHookPreface, if set, runs on a new connection between the TLS
	// handshake and the client preface.
	testHookPreface func()

	mu     sync.Mutex
	keys   map[Key]*keyConns      // guarded by mu
	all    map[*poolConn]struct{} // guarded by mu: every open connection, pooled or retired
	closed bool                   // guarded by mu: Close ran
	drain  bool                   // guarded by mu: Shutdown ran; no new streams
}

// keyConns is the pool state of one Key; guarded by Pool.mu.
type keyConns struct {
	conns   []*poolConn    // usable connections, oldest first
	dials   []*pendingDial // connections being set up
	peerMax int            // last peer MAX_CONCURRENT_STREAMS seen, 0 unknown
}

// pendingDial is a connection being set up. Connects that find no free
// stream slot claim one of its slots and wait on done instead of dialing,
// so N concurrent first Connects open ceil(N/max) connections.
type pendingDial struct {
	done   chan struct{}
	claims int       // guarded by Pool.mu
	err    error     // set before done is closed
	conn   *poolConn // set before done is closed
}

// NewPool returns a Pool. Close it to release its connections.
func NewPool(opts PoolOptions) (*Pool, error) {
	if opts.TLS == nil {
		return nil, errors.New("hbone: new pool: PoolOptions.TLS is required")
	}
	p := &Pool{
		dial:        opts.Dial,
		tlsFor:      opts.TLS,
		maxStreams:  opts.MaxStreamsPerConn,
		idleTimeout: opts.IdleTimeout,
		log:         opts.Logger,
		metrics:     newPoolMetrics(opts.Registerer),
		keys:        make(map[Key]*keyConns),
		all:         make(map[*poolConn]struct{}),
	}
	if p.dial == nil {
		p.dial = (&net.Dialer{}).DialContext
	}
	if p.maxStreams <= 0 {
		p.maxStreams = DefaultMaxStreamsPerConn
	}
	if p.idleTimeout == 0 {
		p.idleTimeout = DefaultIdleTimeout
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Connect opens a CONNECT stream to authority (the inner destination,
// "ip:port", or "host:port" for a service hostname) over a pooled
// connection for key, sending hdr's fields (may be nil; not modified).
// It returns once the server answered 200; any
// other status is a *StatusError. ctx bounds only the setup: the stream
// lives until Close. Failures to set up a connection are *ConnectError.
func (p *Pool) Connect(ctx context.Context, key Key, authority string, hdr *ConnectHeader) (*Stream, error) {
	if err := checkClientAuthority(authority); err != nil {
		return nil, err
	}
	var err error
	for range maxConnectAttempts {
		var c *poolConn
		if c, err = p.reserve(ctx, key); err != nil {
			// A new connection the peer closed before it carried anything
			// (a server restarting, or one that shed it under load) is
			// worth another dial, as a refused stream is worth another
			// connection: nothing was sent on it, and every stream
			// waiting on that dial would fail with it.
			if !errors.Is(err, errClosedAfterHandshake) || ctx.Err() != nil {
				return nil, err
			}
			p.log.Debug("hbone: retrying CONNECT on a new connection", "key", key.String(), "error", err)
			continue
		}
		var s *Stream
		var retry bool
		if s, retry, err = p.open(ctx, c, authority, hdr); err == nil {
			return s, nil
		}
		if !retry || ctx.Err() != nil {
			return nil, err
		}
		p.log.Debug("hbone: retrying CONNECT on another connection", "key", key.String(), "error", err)
	}
	return nil, err
}

// reserve returns a connection for key with one stream slot reserved for
// the caller, waiting for (or starting) a dial when none has room.
func (p *Pool) reserve(ctx context.Context, key Key) (*poolConn, error) {
	dead := 0 // dials that succeeded but were closed before we got a slot
	p.mu.Lock()
	for {
		if p.closed || p.drain {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		kc := p.keys[key]
		if kc == nil {
			kc = &keyConns{}
			p.keys[key] = kc
		}
		if c := p.reserveLocked(kc); c != nil {
			p.mu.Unlock()
			return c, nil
		}
		d := kc.claimLocked(p.dialCapacityLocked(kc))
		if d != nil {
			if p.testHookClaim != nil {
				p.testHookClaim()
			}
		} else {
			d = &pendingDial{done: make(chan struct{}), claims: 1}
			kc.dials = append(kc.dials, d)
			p.wg.Add(1)
			go p.dialConn(key, d)
		}
		p.mu.Unlock()

		select {
		case <-d.done:
		case <-ctx.Done():
			p.mu.Lock()
			d.claims--
			p.mu.Unlock()
			return nil, fmt.Errorf("hbone: connect %s: %w", key.Addr, ctx.Err())
		}
		p.mu.Lock()
		if d.err != nil {
			p.mu.Unlock()
			return nil, d.err
		}
		// The dial succeeded; loop to take a slot on it (or any other) —
		// unless the peer keeps closing new connections as soon as they
		// are up, which would otherwise be redialled without end.
		if d.conn.h.closing() {
			if dead++; dead >= maxConnectAttempts {
				p.mu.Unlock()
				return nil, &ConnectError{Reason: ReasonHTTP2, Addr: key.Addr.String(), Err: fmt.Errorf("peer closed %d new connections as soon as they were up", dead)}
			}
		}
	}
}

// reserveLocked takes a stream slot on the first connection of kc with
// room, retiring connections that are closed or got GOAWAY.
func (p *Pool) reserveLocked(kc *keyConns) *poolConn {
	for i := 0; i < len(kc.conns); {
		c := kc.conns[i]
		if c.streams < c.limit {
			if !c.h.closing() {
				c.streams++
				c.stopIdleLocked()
				p.metrics.streamDelta(1)
				return c
			}
			// Closed or GOAWAY: with none of our streams on it, the
			// connection is of no use now: retire it.
			if c.streams == 0 && !c.retired {
				p.retireLocked(c)
				continue // kc.conns shifted down
			}
		}
		i++
	}
	return nil
}

// claimLocked claims a slot on a pending dial with room, or returns nil.
func (kc *keyConns) claimLocked(capacity int) *pendingDial {
	for _, d := range kc.dials {
		if d.claims < capacity {
			d.claims++
			return d
		}
	}
	return nil
}

// dialCapacityLocked is how many streams a new connection for kc is
// expected to carry: our limit, capped by what the peer said last time.
func (p *Pool) dialCapacityLocked(kc *keyConns) int {
	if kc.peerMax > 0 && kc.peerMax < p.maxStreams {
		return kc.peerMax
	}
	return p.maxStreams
}

// retireLocked removes c from its key so it gets no new streams. It is
// closed now if it has no streams, else when its last stream ends.
func (p *Pool) retireLocked(c *poolConn) {
	if c.retired {
		return
	}
	c.retired = true
	c.stopIdleLocked()
	p.unlinkLocked(c)
	if c.streams == 0 {
		p.closeLocked(c)
	}
}

// unlinkLocked removes c from its key's connections, and the key when
// nothing is left.
func (p *Pool) unlinkLocked(c *poolConn) {
	kc := p.keys[c.key]
	if kc == nil {
		return
	}
	for i, x := range kc.conns {
		if x == c {
			kc.conns = append(kc.conns[:i], kc.conns[i+1:]...)
			break
		}
	}
	if len(kc.conns) == 0 && len(kc.dials) == 0 {
		delete(p.keys, c.key)
	}
}

// closeLocked forgets c and closes it on a goroutine: closing an HTTP/2
// connection can wait for its write lock and the TLS close_notify, which
// must not happen under mu. A connection still in p.all means Close has
// not run, so the goroutine is counted before Close waits.
func (p *Pool) closeLocked(c *poolConn) {
	if _, ok := p.all[c]; !ok {
		return
	}
	delete(p.all, c)
	p.metrics.connDelta(-1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		c.h.close(nil)
	}()
}

// release returns the stream slot reserved on c.
func (p *Pool) release(c *poolConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.streams--
	p.metrics.streamDelta(-1)
	if c.streams > 0 {
		return
	}
	if c.retired || p.closed {
		p.closeLocked(c)
		return
	}
	p.armIdleLocked(c)
}

// armIdleLocked starts c's idle timer; a stream reserved before it fires
// stops it.
func (p *Pool) armIdleLocked(c *poolConn) {
	if p.idleTimeout < 0 {
		return
	}
	c.stopIdleLocked()
	c.idleSeq++
	seq := c.idleSeq
	c.idle = time.AfterFunc(p.idleTimeout, func() { p.onIdle(c, seq) })
}

func (p *Pool) onIdle(c *poolConn, seq uint64) {
	p.mu.Lock()
	if p.closed || c.retired || c.streams > 0 || c.idleSeq != seq {
		p.mu.Unlock()
		return
	}
	c.retired = true
	p.unlinkLocked(c)
	delete(p.all, c)
	p.metrics.connDelta(-1)
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()

	p.log.Debug("hbone: closing idle connection", "key", c.key.String())
	// GOAWAY first so the server knows this close is deliberate.
	ctx, cancel := context.WithTimeout(p.ctx, time.Second)
	defer cancel()
	_ = c.h.shutdown(ctx)
}

// Close closes every connection at once, resetting open streams, and
// waits for the pool's goroutines. Later Connects fail with ErrPoolClosed.
// Close is safe to call more than once.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for c := range p.all {
		c.stopIdleLocked()
	}
	conns := p.all
	p.all = make(map[*poolConn]struct{})
	p.keys = make(map[Key]*keyConns)
	p.mu.Unlock()

	p.cancel()
	for c := range conns {
		p.metrics.connDelta(-1)
		c.h.close(ErrPoolClosed)
	}
	p.wg.Wait()
	return nil
}

// Shutdown stops new Connects, sends GOAWAY on every connection and waits
// for their streams to end; at ctx's deadline it closes what remains
// (Close) and returns ctx.Err().
func (p *Pool) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.drain = true
	conns := make([]*poolConn, 0, len(p.all))
	for c := range p.all {
		conns = append(conns, c)
	}
	p.mu.Unlock()

	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { _ = c.h.shutdown(ctx) })
	}
	wg.Wait()
	err := ctx.Err()
	_ = p.Close()
	return err
}
