package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/workers"
)

// Ports ztunnel listens on inside each served workload's network namespace.
const (
	OutboundPort         = 15001
	InboundPlaintextPort = 15006
	HBONEPort            = 15008
)

// LocalWorkload names the workload a Proxy serves (from ZDS's WorkloadInfo
// in shared mode, PROXY_WORKLOAD_INFO in dedicated mode).
type LocalWorkload struct {
	Namespace      string
	Name           string
	ServiceAccount string
}

// Options configure a Proxy. State, Pool, Certs and Dial are required.
type Options struct {
	// State returns the current config snapshot.
	State func() *state.Snapshot
	// Pool carries outbound HBONE; its Dial must create sockets where this
	// workload's traffic should originate (the pod netns) and mark them.
	Pool *hbone.Pool
	// Certs provides this workload's certificate and the trust bundle.
	Certs *identity.Manager
	// Dial opens plain TCP upstream connections (passthrough, inbound
	// delivery) with the mark set, from the workload's netns.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialFrom, if set, opens inbound deliveries from the client's own
	// address src (IP_TRANSPARENT), so the app sees the real client, as
	// upstream does in-pod. If it fails and RequireOriginalSource is false,
	// Dial is used instead.
	DialFrom              func(ctx context.Context, network, addr string, src netip.Addr) (net.Conn, error)
	RequireOriginalSource bool
	// Local is the served workload.
	Local LocalWorkload
	// TrustDomain for Local's identity when state has no workload for it.
	TrustDomain string
	// Network is this node's network (NETWORK).
	Network string
	// ClusterID labels metrics of the local side.
	ClusterID string
	// Metrics may be shared by many proxies; nil creates unregistered ones.
	Metrics *Metrics
	// Workers runs each accepted connection's set-up (and each inbound
	// HBONE stream's) on goroutines kept between connections, shared by
	// every proxy of the process; nil starts a goroutine for each.
	Workers *workers.Pool
	// Logger receives access logs and errors; nil discards.
	Logger *slog.Logger
	// Registerer receives the HBONE server's metrics (shared safely by
	// many proxies); nil means none.
	Registerer prometheus.Registerer
	// ConnectTimeout bounds upstream dials; 0 means 10s.
	ConnectTimeout time.Duration
	// MetricsFlushInterval is how often live connections' byte counts are
	// added to the metrics; 0 means 5s.
	MetricsFlushInterval time.Duration
}

// Proxy serves one workload's outbound, inbound and plaintext listeners.
type Proxy struct {
	// immutable after New
	opts    Options
	log     *slog.Logger
	m       *Metrics
	self    identity.Identity
	selfID  string // self.String(), built once: every connection's labels carry it
	inbound *hbone.Server
	ctx     context.Context // cancelled by Close: ends every connection
	cancel  context.CancelFunc

	conns *tracker

	mu        sync.Mutex
	listeners []net.Listener // guarded by mu
	draining  bool           // guarded by mu
	wg        sync.WaitGroup // accept loops and watchers
}

// New builds a proxy; call the Serve* methods with its listeners.
func New(opts Options) (*Proxy, error) {
	if opts.State == nil || opts.Pool == nil || opts.Certs == nil || opts.Dial == nil {
		return nil, errors.New("proxy: new: State, Pool, Certs and Dial are required")
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.MetricsFlushInterval == 0 {
		opts.MetricsFlushInterval = 5 * time.Second
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		opts:   opts,
		log:    log,
		m:      opts.Metrics,
		self:   identity.New(opts.TrustDomain, opts.Local.Namespace, opts.Local.ServiceAccount),
		ctx:    ctx,
		cancel: cancel,
		conns:  newTracker(),
	}
	p.selfID = p.self.String()
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS:        opts.Certs.ServerConfig(p.self),
		Handler:    p.handleHBONE,
		Workers:    opts.Workers,
		Logger:     log,
		Registerer: opts.Registerer,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("proxy: new: %w", err)
	}
	p.inbound = srv
	// Ask for the certificate now so the first connection does not wait.
	_ = opts.Certs.Prefetch(p.self)
	p.wg.Add(1)
	go p.watchPolicy()
	return p, nil
}

// Identity is the served workload's identity.
func (p *Proxy) Identity() identity.Identity { return p.self }

// addListener registers ln for Shutdown to close and counts the goroutine
// that will serve it (the caller runs it and calls p.wg.Done). The count is
// taken under mu with the draining check, so it happens before Shutdown's
// p.wg.Wait or not at all.
func (p *Proxy) addListener(ln net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining {
		ln.Close()
		return false
	}
	p.listeners = append(p.listeners, ln)
	p.wg.Add(1)
	return true
}

// ServeOutbound accepts redirected outbound connections on ln (15001)
// until Shutdown.
func (p *Proxy) ServeOutbound(ln net.Listener) {
	p.serve(ln, p.handleOutbound)
}

// ServeInboundPlaintext accepts plaintext inbound connections (15006).
func (p *Proxy) ServeInboundPlaintext(ln net.Listener) {
	p.serve(ln, p.handlePlaintext)
}

// ServeHBONE accepts mTLS HBONE connections (15008).
func (p *Proxy) ServeHBONE(ln net.Listener) {
	if !p.addListener(ln) {
		return
	}
	ln = countAccepts(ln, p.m)
	go func() {
		defer p.wg.Done()
		if err := p.inbound.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
			p.log.Debug("hbone serve ended", "err", err)
		}
	}()
}

func (p *Proxy) serve(ln net.Listener, handle func(*net.TCPConn)) {
	if !p.addListener(ln) {
		return
	}
	ln = countAccepts(ln, p.m)
	go func() {
		defer p.wg.Done()
		var delay time.Duration
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Transient (EMFILE, ECONNABORTED): back off briefly.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				p.log.Warn("accept failed", "addr", ln.Addr().String(), "err", err)
				select {
				case <-time.After(delay):
					continue
				case <-p.ctx.Done():
					return
				}
			}
			delay = 0
			tc, ok := c.(*net.TCPConn)
			if !ok {
				c.Close()
				continue
			}
			end := p.conns.begin()
			p.opts.Workers.Go(func() {
				defer end()
				handle(tc)
			})
		}
	}()
}

// Shutdown stops accepting, sends GOAWAY on inbound HBONE connections, waits
// for live connections until ctx ends, then closes the rest.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.draining = true
	lns := p.listeners
	p.listeners = nil
	p.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	hctx, hcancel := context.WithCancel(ctx)
	hdone := make(chan struct{})
	go func() {
		p.inbound.Shutdown(hctx)
		close(hdone)
	}()
	p.conns.drain(ctx, p.cancel)
	// Streams are done, but their last frames may still be on the way out:
	// let the HBONE server finish its graceful close unless time is up.
	select {
	case <-hdone:
	case <-ctx.Done():
	}
	hcancel()
	<-hdone
	p.cancel()
	p.inbound.Close()
	p.wg.Wait()
	return nil
}

// Close ends everything at once.
func (p *Proxy) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return p.Shutdown(ctx)
}

// Connections is the number of live proxied connections.
func (p *Proxy) Connections() int { return p.conns.len() }

// watchPolicy re-checks inbound connections whenever config changes, so a
// connection a new DENY (or a removed ALLOW) no longer permits is closed.
// It also flushes live byte counts into the metrics on a timer.
func (p *Proxy) watchPolicy() {
	defer p.wg.Done()
	tick := time.NewTicker(p.opts.MetricsFlushInterval)
	defer tick.Stop()
	// Each turn evaluates the snapshot read on waking and then waits on
	// that same snapshot, which leaves no gap: a change published during
	// the evaluation has already closed its Changed channel. (Reading the
	// state afresh at the top of each turn missed a change published
	// between the evaluation and that read, as when a config is applied in
	// two steps, addresses then policies, and the DENY went unenforced
	// until some later change.)
	snap := p.opts.State()
	for {
		select {
		case <-snap.Changed():
			snap = p.opts.State()
			if n := p.conns.reevaluate(snap); n > 0 {
				p.log.Info("closed connections no longer allowed by policy", "count", n)
			}
		case <-tick.C:
			p.conns.flush()
		case <-p.ctx.Done():
			return
		}
	}
}

// isLocal reports whether w is the workload this proxy serves (matched by
// namespace and name, as ZDS and PROXY_WORKLOAD_INFO identify it).
func (p *Proxy) isLocal(w *state.Workload) bool {
	return w != nil && w.Namespace == p.opts.Local.Namespace && w.Name == p.opts.Local.Name
}

// authorize evaluates the destination workload's policies.
func authorize(snap *state.Snapshot, dst *state.Workload, c rbac.Conn) rbac.Decision {
	var buf [8]*rbac.Policy
	return rbac.Evaluate(slices.AppendSeq(buf[:0], snap.PoliciesFor(dst)), c)
}

// dialInbound connects to the served workload, from src when configured.
func (p *Proxy) dialInbound(ctx context.Context, dst netip.AddrPort, src netip.Addr) (net.Conn, error) {
	if p.opts.DialFrom != nil && src.IsValid() {
		c, err := p.opts.DialFrom(ctx, "tcp", dst.String(), src)
		if err == nil || p.opts.RequireOriginalSource {
			return c, err
		}
		p.log.Debug("original-source dial failed; delivering from the pod address", "src", src.String(), "dst", dst.String(), "err", err)
	}
	return p.opts.Dial(ctx, "tcp", dst.String())
}

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}
