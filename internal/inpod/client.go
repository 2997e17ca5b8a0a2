package inpod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// Timing, from upstream's workload manager.
const (
	// retryInterval: how often pods whose proxy failed to start are retried.
	retryInterval = 5 * time.Second
	// backoffMin/backoffMax bound the wait before reconnecting to the agent
	// (upstream: 10 ms doubling to 15 s). The backoff resets only after a
	// connection delivered a snapshot, so an agent that accepts and hangs up
	// at once is not hammered.
	backoffMin = 10 * time.Millisecond
	backoffMax = 15 * time.Second
	// ackWriteTimeout: the agent waits 5 s for each Ack; a write that cannot
	// finish in that time means the connection is dead.
	ackWriteTimeout = 5 * time.Second
)

// Options configure a Client.
type Options struct {
	// UDSPath is the agent's SOCK_SEQPACKET socket (INPOD_UDS, upstream
	// default /var/run/ztunnel/ztunnel.sock). Required.
	UDSPath string
	// PodServer starts per-pod proxies. Required.
	PodServer PodServer
	// Netns options apply to every pod's sockets (PACKET_MARK,
	// INPOD_PORT_REUSE).
	Netns NetnsOptions
	// OnReady, if not nil, is called from the client goroutine whenever
	// readiness changes: true once a connection's snapshot is in and every
	// pod's proxy started, false when the connection drops or a start fails.
	OnReady func(ready bool)
	// OnConnectError, if not nil, is called from the client goroutine each
	// time connecting to the agent, or a session with it, fails; readiness
	// uses it to say why the snapshot has not arrived.
	OnConnectError func(err error)
	// Logger may be nil (discard).
	Logger *slog.Logger
	// Registerer may be nil (no metrics).
	Registerer prometheus.Registerer
}

// Client is ztunnel's side of ZDS: it connects to the node agent, receives
// pods and runs their proxies through the PodServer.
type Client struct {
	// immutable after New
	path           string
	log            *slog.Logger
	onReady        func(bool)
	onConnectError func(error)
	metrics        *metrics
	state          *stateManager
	// timings, shortened by tests
	backoffMin, backoffMax, retryInterval time.Duration

	ready    atomic.Bool
	started  atomic.Bool
	stopCtx  context.Context // cancelled by Shutdown
	stop     context.CancelFunc
	runDone  chan struct{} // closed when Run returns
	drainMu  sync.Mutex    // serialises Shutdown's drain
	drainErr error         // guarded by drainMu
}

// New checks opts and returns an idle Client; call Run.
func New(opts Options) (*Client, error) {
	if opts.UDSPath == "" {
		return nil, errors.New("inpod: new client: UDSPath is required")
	}
	if opts.PodServer == nil {
		return nil, errors.New("inpod: new client: PodServer is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	nsOpts := opts.Netns
	c := &Client{
		path: opts.UDSPath, log: log, onReady: opts.OnReady, onConnectError: opts.OnConnectError, metrics: m,
		state: newStateManager(opts.PodServer, log, m, func(fd int) (*Netns, error) {
			return NewNetns(fd, nsOpts)
		}),
		backoffMin: backoffMin, backoffMax: backoffMax, retryInterval: retryInterval,
		runDone: make(chan struct{}),
	}
	c.stopCtx, c.stop = context.WithCancel(context.Background())
	return c, nil
}

// Ready reports the current readiness (see Options.OnReady).
func (c *Client) Ready() bool { return c.ready.Load() }

// WorkloadState is the "workloadState" section of /config_dump, keyed by
// pod uid (upstream's shape).
func (c *Client) WorkloadState() map[string]ProxyState { return c.state.dump() }

// Run connects to the agent and serves it until ctx is done or Shutdown is
// called, reconnecting with backoff whenever the connection drops. Pods keep
// serving across reconnects; on the next connection the agent resends its
// cache and SnapshotSent removes what is gone. Run leaves pods running when
// it returns: Shutdown drains them. It returns nil after Shutdown, ctx.Err()
// otherwise.
func (c *Client) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("inpod: client already running")
	}
	defer close(c.runDone)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.stopCtx, cancel)()

	wait := c.backoffMin
	for ctx.Err() == nil {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unixpacket", c.path)
		if err == nil {
			var synced bool
			synced, err = c.session(ctx, nc.(*net.UnixConn))
			c.setReady(false)
			if synced {
				wait = c.backoffMin
			}
			if ctx.Err() != nil {
				break
			}
			if err == nil {
				c.log.Info("node agent closed the connection, reconnecting")
				if synced {
					continue
				}
			}
		}
		if err != nil {
			c.log.Warn("connection to the Istio CNI node agent failed; is the node agent healthy?",
				"path", c.path, "err", err, "retry_in", wait)
			if c.onConnectError != nil {
				c.onConnectError(err)
			}
		}
		if !sleep(ctx, jitter(wait)) {
			break
		}
		wait = min(wait*2, c.backoffMax)
	}
	if c.stopCtx.Err() != nil {
		return nil
	}
	return ctx.Err()
}

// Shutdown stops Run (closing the agent connection, so a new ztunnel can
// take over), then drains every pod until ctx is done and force-closes what
// is left. Safe to call more than once, and without Run.
func (c *Client) Shutdown(ctx context.Context) error {
	c.stop()
	if c.started.Load() {
		select {
		case <-c.runDone:
		default:
			select {
			case <-c.runDone:
			case <-ctx.Done():
				return fmt.Errorf("inpod: shutdown: wait for the client loop: %w", ctx.Err())
			}
		}
	}
	c.drainMu.Lock()
	defer c.drainMu.Unlock()
	if err := c.state.drainAll(ctx); err != nil {
		c.drainErr = errors.Join(c.drainErr, err)
	}
	return c.drainErr
}

type readResult struct {
	req Request
	err error
}

// session serves one connection: hello, then one Ack per request. It
// returns whether a snapshot completed, and nil when the agent hung up.
func (c *Client) session(ctx context.Context, conn *net.UnixConn) (synced bool, err error) {
	c.log.Info("connected to the node agent", "path", c.path)
	c.state.resetSnapshot()

	msgs := make(chan readResult)
	done := make(chan struct{})
	var reader sync.WaitGroup
	defer func() {
		_ = conn.Close() // unblocks the reader
		close(done)
		reader.Wait()
	}()
	if err := WriteMsg(conn, &zdspb.ZdsHello{Version: zdspb.Version_V1}); err != nil {
		return false, fmt.Errorf("inpod: announce to node agent: %w", err)
	}
	reader.Go(func() {
		for {
			req, err := ReadRequest(conn)
			select {
			case msgs <- readResult{req, err}:
			case <-done:
				closeFDs([]int{req.FD})
				return
			}
			var perr *Error
			if err != nil && !errors.As(err, &perr) {
				return
			}
		}
	})

	var retry *time.Timer
	var retryC <-chan time.Time
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return synced, nil
		case <-retryC:
			retryC = nil
			c.state.retryPending(ctx)
			if c.state.havePending() {
				retry.Reset(c.retryInterval)
				retryC = retry.C
			}
			c.updateReady()
		case r := <-msgs:
			var perr *Error
			if r.err != nil && !errors.As(r.err, &perr) {
				if errors.Is(r.err, io.EOF) {
					return synced, nil
				}
				return synced, r.err
			}
			herr := r.err
			if herr == nil {
				herr = c.state.handle(ctx, r.req)
			}
			if err := c.ack(conn, r.req, herr); err != nil {
				return synced, err
			}
			if herr == nil && r.req.Kind == KindSnapshotSent {
				synced = true
				c.log.Info("snapshot received from the node agent")
			}
			if errors.As(herr, &perr) && perr.Reason == ReasonStartFailed && retryC == nil {
				if retry == nil {
					retry = time.NewTimer(c.retryInterval)
				} else {
					retry.Reset(c.retryInterval)
				}
				retryC = retry.C
			}
			c.updateReady()
		}
	}
}

// ack answers one request: an empty error means success.
func (c *Client) ack(conn *net.UnixConn, req Request, herr error) error {
	text := ""
	if herr != nil {
		text = herr.Error()
		reason := ReasonDecode
		var perr *Error
		if errors.As(herr, &perr) {
			reason = perr.Reason
		}
		c.metrics.errors.WithLabelValues(string(reason)).Inc()
		c.log.Error("rejecting node agent request", "kind", req.Kind, "uid", req.UID, "reason", reason, "err", herr)
	}
	_ = conn.SetWriteDeadline(time.Now().Add(ackWriteTimeout))
	resp := &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: text}}}
	if err := WriteMsg(conn, resp); err != nil {
		return fmt.Errorf("inpod: send ack: %w", err)
	}
	return nil
}

func (c *Client) updateReady() { c.setReady(c.state.ready()) }

func (c *Client) setReady(r bool) {
	if c.ready.Swap(r) == r {
		return
	}
	c.log.Info("workload manager readiness changed", "ready", r)
	if c.onReady != nil {
		c.onReady(r)
	}
}

// jitter spreads d by ±20% (upstream's randomization factor).
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
