package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"golang.org/x/sys/unix"
)

// Load-generator constants.
const (
	msgSize = 1024 // request and response size of the latency phases
	// ioTimeout bounds every single operation (dial, one request, one
	// idle round trip): a stall longer than this fails the run instead of
	// hanging it.
	ioTimeout = 5 * time.Second
	// bulkDrain bounds how long a bulk stream may take to deliver what is
	// in flight after its sending time is up.
	bulkDrain = 30 * time.Second
)

// path is the client side of one scenario: the pod it dials from and the
// server it dials. Counters let the run check ztunnel saw every connection
// and report how many bytes were verified.
type path struct {
	client *nstest.Pod
	server netip.Addr
	// portShift is added to every server port dialled: relay-pair's
	// relays listen on shifted ports (relayPortShift).
	portShift int

	// jitter: open loops on this path send at jittered points of their
	// slots (see slots); set for the profile loads only.
	jitter bool
	// mss, when set, is the TCP_MAXSEG of every socket the client dials
	// with: the relay scenarios' (redirectedMSS).
	mss int

	dials    atomic.Int64 // connections established
	verified atomic.Int64 // payload bytes received and checked
}

func (p *path) addr(port int) string { return p.addrPort(port).String() }

func (p *path) addrPort(port int) netip.AddrPort {
	return netip.AddrPortFrom(p.server, uint16(port+p.portShift))
}

// dial connects from the client pod (any goroutine).
func (p *path) dial(ctx context.Context, port int) (net.Conn, error) {
	var c net.Conn
	err := p.client.Do(func() (err error) {
		c, err = p.dialHere(ctx, port)
		return err
	})
	return c, err
}

// dialer is a dialer for the client's sockets, with p.mss if set.
func (p *path) dialer() *net.Dialer { return mssDialer(p.mss) }

// mssDialer is a dialer whose sockets get TCP_MAXSEG mss, if mss > 0.
func mssDialer(mss int) *net.Dialer {
	d := &net.Dialer{}
	if mss > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = setMSS(int(fd), mss) }); err != nil {
				return err
			}
			return serr
		}
	}
	return d
}

// setMSS caps the segments a socket sends and announces (before connect).
func setMSS(fd, mss int) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss); err != nil {
		return fmt.Errorf("bench: TCP_MAXSEG %d: %w", mss, err)
	}
	return nil
}

// dialHere connects from the calling thread's namespace; for workers
// running inside p.client.Do, where a dial costs no namespace switch.
func (p *path) dialHere(ctx context.Context, port int) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, ioTimeout)
	defer cancel()
	c, err := p.dialer().DialContext(dctx, "tcp", p.addr(port))
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", p.addr(port), p.client.Name, err)
	}
	p.dials.Add(1)
	return c, nil
}

// inClient runs n workers, each on its own OS thread inside the client
// pod's namespace, and returns the first error.
func (p *path) inClient(n int, work func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = p.client.Do(func() error { return work(i) }) })
	}
	wg.Wait()
	return firstOf(errs)
}

// firstOf returns the first non-nil error, saying how many others there
// were (a burst of identical failures would otherwise bury the run's
// output).
func firstOf(errs []error) error {
	var first error
	others := 0
	for _, err := range errs {
		switch {
		case err == nil:
		case first == nil:
			first = err
		default:
			others++
		}
	}
	if others > 0 {
		return fmt.Errorf("%w (and %d more failures)", first, others)
	}
	return first
}

// firstError keeps the first error and cancels the phase.
type firstError struct {
	once   sync.Once
	err    error
	cancel context.CancelFunc
}

func (f *firstError) set(err error) {
	if err == nil {
		return
	}
	f.once.Do(func() { f.err = err; f.cancel() })
}

// roundTrip writes req on c and checks the echoed answer into resp.
func roundTrip(c net.Conn, req, resp []byte) error {
	if err := c.SetDeadline(time.Now().Add(ioTimeout)); err != nil {
		return err
	}
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	if _, err := io.ReadFull(c, resp); err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if !bytes.Equal(req, resp) {
		return errors.New("response differs from the request")
	}
	return nil
}

// openLoopResult is one open-loop phase.
type openLoopResult struct {
	latency Latency // from each request's scheduled send time to its full response
	lag     Latency // from the scheduled time to the moment a worker began it
	elapsed time.Duration
	// Each request's latency in schedule order: request i was due at
	// start + slots.due(i).
	each  []time.Duration
	start time.Time
	slots slots
}

// openLoop sends rate requests/s of msgSize bytes for d, each checked
// against its echo. reuse: conns persistent connections; otherwise every
// request dials a new connection (at most conns in flight, on sockets a
// socketFactory makes in the client pod) and closes it.
func (p *path) openLoop(ctx context.Context, rate int, d time.Duration, reuse bool, conns int) (openLoopResult, error) {
	n := max(1, int(float64(rate)*d.Seconds()))
	sl := slots{interval: time.Second / time.Duration(rate), jitter: p.jitter}
	lat := make([]time.Duration, n)
	lag := make([]time.Duration, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fe := &firstError{cancel: cancel}

	var pool []net.Conn
	if reuse {
		for range conns {
			c, err := p.dial(ctx, echoPort)
			if err != nil {
				closeAll(pool)
				return openLoopResult{}, err
			}
			pool = append(pool, c)
		}
		defer closeAll(pool)
	}
	var sockets *socketFactory
	if !reuse {
		sockets = newSocketFactory(p.client, p.mss)
		defer sockets.close() // a failure to make sockets fails the dials, which report it
	}
	ch := make(chan int, n)
	var start time.Time // written by schedule before its first send on ch
	// The schedule starts only when every worker waits on ch: a worker
	// still entering the pod's namespace (a new OS thread and a setns each)
	// when its first requests are due would put a start-up backlog into
	// the figures.
	var waiting atomic.Int64
	allReady := make(chan struct{})
	worker := func(w int) error {
		req, resp := make([]byte, msgSize), make([]byte, msgSize)
		if waiting.Add(1) == int64(conns) {
			close(allReady)
		}
		for i := range ch {
			if ctx.Err() != nil {
				continue // drain
			}
			sched := start.Add(sl.due(i))
			lag[i] = time.Since(sched)
			request(req, uint64(i))
			var c net.Conn
			if reuse {
				c = pool[w]
			} else {
				var err error
				if c, err = sockets.dial(ctx, p.addrPort(echoPort)); err != nil {
					fe.set(err)
					continue
				}
				p.dials.Add(1)
			}
			err := roundTrip(c, req, resp)
			if !reuse {
				c.Close()
			}
			if err != nil {
				fe.set(fmt.Errorf("request %d: %w", i, err))
				continue
			}
			lat[i] = time.Since(sched)
			p.verified.Add(msgSize)
		}
		return nil
	}
	var wg sync.WaitGroup
	for w := range conns {
		wg.Go(func() { _ = worker(w) })
	}
	select {
	case <-allReady:
	case <-ctx.Done():
	}
	schedule(ctx, n, sl, ch, &start)
	wg.Wait()
	elapsed := time.Since(start)
	if fe.err != nil {
		return openLoopResult{}, fe.err
	}
	if err := ctx.Err(); err != nil {
		return openLoopResult{}, err
	}
	each := slices.Clone(lat) // summarize sorts lat
	return openLoopResult{latency: summarize(lat), lag: summarize(lag), elapsed: elapsed,
		each: each, start: start, slots: sl}, nil
}

// bulk streams the pattern to the sink over streams connections for d and
// returns the delivered rate (bytes the sink confirmed, over the time
// from the start until the last summary arrived) and those bytes.
func (p *path) bulk(ctx context.Context, streams int, d time.Duration) (float64, int64, error) {
	cs := make([]net.Conn, 0, streams)
	for range streams {
		c, err := p.dial(ctx, sinkPort)
		if err != nil {
			closeAll(cs)
			return 0, 0, err
		}
		cs = append(cs, c)
	}
	defer closeAll(cs)
	start := time.Now()
	deadline := start.Add(d)
	until := func() bool { return time.Now().After(deadline) || ctx.Err() != nil }
	var wg sync.WaitGroup
	sent := make([]int64, streams)
	errs := make([]error, streams)
	for i, c := range cs {
		wg.Go(func() { sent[i], errs[i] = p.stream(c, until, deadline.Add(bulkDrain), nil) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := firstOf(errs); err != nil {
		return 0, 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	var total int64
	for _, s := range sent {
		total += s
	}
	return gbps(total, elapsed), total, nil
}

// stream writes the pattern on c until done() says stop, half-closes, and
// checks the sink's summary: every byte arrived, none was wrong. A non-nil
// v pauses the writes while it is closed and counts them.
func (p *path) stream(c net.Conn, done func() bool, deadline time.Time, v *valve) (int64, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return 0, err
	}
	var off int64
	for !done() {
		if v.wait(); done() {
			break
		}
		n, err := c.Write(patternAt(off, maxChunk))
		off += int64(n)
		if v != nil {
			v.written.Add(int64(n))
		}
		if err != nil {
			return off, fmt.Errorf("bulk write after %d bytes: %w", off, err)
		}
	}
	hc, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return off, fmt.Errorf("bulk: %T cannot half-close", c)
	}
	if err := hc.CloseWrite(); err != nil {
		return off, fmt.Errorf("bulk half-close: %w", err)
	}
	var sum [sinkSummaryLen]byte
	if _, err := io.ReadFull(c, sum[:]); err != nil {
		return off, fmt.Errorf("bulk summary after sending %d bytes: %w", off, err)
	}
	got := int64(binary.LittleEndian.Uint64(sum[:8]))
	bad := int64(binary.LittleEndian.Uint64(sum[8:]))
	if got != off {
		return off, fmt.Errorf("bulk: sent %d bytes, sink received %d", off, got)
	}
	if bad >= 0 {
		return off, fmt.Errorf("bulk: sink saw a wrong byte at offset %d of %d", bad, got)
	}
	p.verified.Add(got)
	return off, nil
}

// connRate dials, does a 1-byte round trip and closes, in a closed loop
// on workers goroutines for d, and returns completed connections per
// second.
func (p *path) connRate(ctx context.Context, workers int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fe := &firstError{cancel: cancel}
	var done atomic.Int64
	// Plain goroutines on sockets made in the pod, as in the new-connection
	// phase (nsdial.go): the harness's own share of each connection's CPU
	// and wake-ups is what it takes from the ztunnels it measures on the
	// same two cores.
	sockets := newSocketFactory(p.client, p.mss)
	defer sockets.close()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { fe.set(connLoop(ctx, p, sockets, w, deadline, &done)) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	if fe.err != nil {
		return 0, fe.err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(done.Load()) / elapsed.Seconds(), nil
}

// connLoop is one closed-loop worker of connRate.
func connLoop(ctx context.Context, p *path, sockets *socketFactory, w int, deadline time.Time, done *atomic.Int64) error {
	req, resp := []byte{byte(w)}, []byte{0}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		c, err := sockets.dial(ctx, p.addrPort(echoPort))
		if err != nil {
			return err
		}
		p.dials.Add(1)
		err = roundTrip(c, req, resp)
		c.Close()
		if err != nil {
			return fmt.Errorf("connection %d: %w", done.Load(), err)
		}
		done.Add(1)
		p.verified.Add(1)
		req[0]++
	}
	return nil
}

// openIdle opens n connections (parallel at a time), each proven
// end-to-end by a 1-byte round trip, and leaves them open and idle.
func (p *path) openIdle(ctx context.Context, n, parallel int) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	var next atomic.Int64
	err := p.inClient(parallel, func(int) error {
		resp := []byte{0}
		for {
			i := int(next.Add(1) - 1)
			if i >= n || ctx.Err() != nil {
				return ctx.Err()
			}
			c, err := p.dialHere(ctx, echoPort)
			if err != nil {
				return err
			}
			conns[i] = c
			if err := roundTrip(c, []byte{byte(i)}, resp); err != nil {
				return fmt.Errorf("idle connection %d: %w", i, err)
			}
			_ = c.SetDeadline(time.Time{})
			p.verified.Add(1)
		}
	})
	if err != nil {
		closeAll(conns)
		return nil, err
	}
	return conns, nil
}

// checkIdle does one more round trip on every idle connection (so each
// was still alive end-to-end after the idle period), then closes them.
func (p *path) checkIdle(conns []net.Conn, parallel int) error {
	defer closeAll(conns)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, parallel)
	for w := range parallel {
		wg.Go(func() {
			resp := []byte{0}
			for {
				i := int(next.Add(1) - 1)
				if i >= len(conns) {
					return
				}
				if err := roundTrip(conns[i], []byte{byte(i + 1)}, resp); err != nil {
					errs[w] = fmt.Errorf("idle connection %d after idling: %w", i, err)
					return
				}
				p.verified.Add(1)
			}
		})
	}
	wg.Wait()
	return firstOf(errs)
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}
