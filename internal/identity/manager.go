package identity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Renewal and retry timing.
const (
	// renewFraction of a certificate's remaining life passes before it is
	// renewed: upstream renews at half life, leaving the other half to ride
	// out a CA outage.
	renewFraction = 0.5
	// renewJitter spreads renewals by ±5% of the life so that identities
	// fetched together (node start) do not all hit the CA together again.
	renewJitter = 0.05
	// retryInitial, retryMax and retryJitter are upstream's failure backoff:
	// 1 s doubling to 150 s, ±20%.
	retryInitial = time.Second
	retryMax     = 150 * time.Second
	retryJitter  = 0.2
	// DefaultIdleTimeout: an identity nobody asked for this long is
	// forgotten, so departed peers stop costing CA calls.
	DefaultIdleTimeout = time.Hour
	// DefaultFetchTimeout bounds one CA call.
	DefaultFetchTimeout = 30 * time.Second
	// DefaultMaxConcurrentFetches is upstream's limit on CA calls in flight.
	DefaultMaxConcurrentFetches = 8
	// touchGranularity: Get records its time at most this often per identity,
	// so hot identities do not bounce one cache line between cores.
	touchGranularity = time.Second
)

// ManagerOptions configures a Manager. Only CA is required.
type ManagerOptions struct {
	// CA signs certificates. Required.
	CA CA
	// TTL is the validity asked of the CA (SECRET_TTL); 0 → DefaultCertTTL.
	TTL time.Duration
	// IdleTimeout forgets identities not asked for this long (checked by
	// Run); 0 → DefaultIdleTimeout, negative → never.
	IdleTimeout time.Duration
	// FetchTimeout bounds one CA call; 0 → DefaultFetchTimeout.
	FetchTimeout time.Duration
	// MaxConcurrentFetches bounds CA calls in flight; 0 → default.
	MaxConcurrentFetches int
	// Logger may be nil (discard).
	Logger *slog.Logger
	// Registerer receives the metrics; nil → no metrics.
	Registerer prometheus.Registerer
}

// Manager keeps one leaf certificate per identity in use: fetched on first
// use (concurrent first uses share one CA call), renewed in the background
// at about half life, retried with backoff on failure while the previous
// certificate keeps serving until it expires. Get never waits for a renewal.
type Manager struct {
	// immutable after construction
	ca        CA
	ttl       time.Duration
	idle      time.Duration
	timeout   time.Duration
	sem       chan struct{}
	log       *slog.Logger
	metrics   *metrics
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	closeOnce sync.Once
	running   atomic.Bool
	wg        sync.WaitGroup // entry goroutines

	mu      sync.RWMutex
	entries map[Identity]*entry // guarded by mu
	closed  bool                // guarded by mu

	tlsMu sync.Mutex
	tls   map[Identity]*tlsConfigs // guarded by tlsMu
}

// entry is one managed identity; its goroutine (runEntry) owns fetching.
type entry struct {
	// immutable after construction
	id     Identity
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: ask for a fetch now

	cur      atomic.Pointer[Certificate] // latest good certificate
	lastUsed atomic.Int64                // UnixNano of the latest Get

	mu      sync.Mutex
	err     error         // guarded by mu: last fetch error, nil after success
	gone    error         // guarded by mu: ErrForgotten/ErrClosed once removed
	changed chan struct{} // guarded by mu: closed and replaced on every change
}

// NewManager returns a Manager; call Run for idle eviction and Close to stop.
func NewManager(opts ManagerOptions) (*Manager, error) {
	if opts.CA == nil {
		return nil, errors.New("identity: new manager: CA is nil")
	}
	m := &Manager{
		ca:      opts.CA,
		ttl:     orDefault(opts.TTL, DefaultCertTTL),
		idle:    orDefault(opts.IdleTimeout, DefaultIdleTimeout),
		timeout: orDefault(opts.FetchTimeout, DefaultFetchTimeout),
		log:     opts.Logger,
		entries: make(map[Identity]*entry),
		tls:     make(map[Identity]*tlsConfigs),
	}
	n := opts.MaxConcurrentFetches
	if n <= 0 {
		n = DefaultMaxConcurrentFetches
	}
	m.sem = make(chan struct{}, n)
	if m.log == nil {
		m.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var err error
	if m.metrics, err = newMetrics(opts.Registerer, m); err != nil {
		return nil, fmt.Errorf("identity: new manager: %w", err)
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Get returns the current certificate for id, starting to manage id if
// needed. Only the first use of an identity (or one whose certificate has
// expired) waits, for at most ctx; if the latest fetch failed and no valid
// certificate exists, Get returns that failure at once.
func (m *Manager) Get(ctx context.Context, id Identity) (*Certificate, error) {
	now := time.Now()
	e, err := m.use(id, now)
	if err != nil {
		return nil, err
	}
	for {
		if c := e.cur.Load(); c != nil && now.Before(c.NotAfter) {
			return c, nil
		}
		e.mu.Lock()
		c, gone, ferr, ch := e.cur.Load(), e.gone, e.err, e.changed
		e.mu.Unlock()
		switch {
		case gone != nil:
			return nil, fmt.Errorf("identity: certificate for %s: %w", id, gone)
		case c != nil && now.Before(c.NotAfter):
			return c, nil
		case ferr != nil:
			return nil, fmt.Errorf("identity: certificate for %s: %w", id, ferr)
		case c != nil: // expired without a failure (clock jump): fetch now
			select {
			case e.kick <- struct{}{}:
			default:
			}
		}
		select {
		case <-ch:
			now = time.Now()
		case <-ctx.Done():
			return nil, fmt.Errorf("identity: certificate for %s: waiting for CA: %w", id, ctx.Err())
		}
	}
}

// Prefetch starts managing id without waiting (e.g. when a pod arrives), so
// its first connection finds the certificate ready.
func (m *Manager) Prefetch(id Identity) error {
	_, err := m.use(id, time.Now())
	return err
}

// use returns id's entry, creating it (and its goroutine) if needed, and
// records the use. Touching under the read lock orders it against the idle
// sweep, which checks lastUsed under the write lock.
func (m *Manager) use(id Identity, now time.Time) (*entry, error) {
	if id.IsZero() {
		return nil, errors.New("identity: certificate: empty identity")
	}
	m.mu.RLock()
	e, closed := m.entries[id], m.closed
	if e != nil {
		e.touch(now)
	}
	m.mu.RUnlock()
	if closed {
		return nil, fmt.Errorf("identity: certificate for %s: %w", id, ErrClosed)
	}
	if e != nil {
		return e, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("identity: certificate for %s: %w", id, ErrClosed)
	}
	if e = m.entries[id]; e != nil {
		e.touch(now)
		return e, nil
	}
	e = &entry{id: id, kick: make(chan struct{}, 1), changed: make(chan struct{})}
	e.ctx, e.cancel = context.WithCancel(m.ctx)
	e.lastUsed.Store(now.UnixNano())
	m.entries[id] = e
	m.wg.Add(1)
	go m.runEntry(e)
	return e, nil
}

func (e *entry) touch(now time.Time) {
	n := now.UnixNano()
	if n-e.lastUsed.Load() >= int64(touchGranularity) {
		e.lastUsed.Store(n)
	}
}

// Forget stops managing id (a pod left): its certificate is dropped, its
// renewal stops and waiting Gets fail with ErrForgotten.
func (m *Manager) Forget(id Identity) {
	m.mu.Lock()
	e := m.entries[id]
	delete(m.entries, id)
	m.mu.Unlock()
	if e != nil {
		m.drop(e, ErrForgotten)
	}
}

func (m *Manager) drop(e *entry, why error) {
	e.cancel()
	e.mu.Lock()
	e.gone = why
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	m.dropTLS(e.id)
	m.log.Debug("identity: stopped managing certificate", "identity", e.id.String(), "reason", why.Error())
}

// runEntry fetches e's certificate, then renews it until e is dropped.
func (m *Manager) runEntry(e *entry) {
	defer m.wg.Done()
	retry := retryInitial
	for {
		select { // a kick that arrived during the last fetch is served by this one
		case <-e.kick:
		default:
		}
		cert, err := m.fetch(e.ctx, e.id)
		if e.ctx.Err() != nil {
			return
		}
		now := time.Now()
		var wait time.Duration
		e.mu.Lock()
		if err == nil {
			e.cur.Store(cert)
			e.err = nil
			retry = retryInitial
			wait = renewDelay(cert, now, rand.Float64())
			m.log.Debug("identity: certificate fetched", "identity", e.id.String(),
				"expires", cert.NotAfter, "renew_in", wait)
		} else {
			e.err = err
			wait = jitter(retry, retryJitter, rand.Float64())
			retry = min(2*retry, retryMax)
			if c := e.cur.Load(); c != nil && now.Before(c.NotAfter) {
				wait = min(wait, c.NotAfter.Sub(now))
				m.log.Warn("identity: certificate renewal failed; serving the current one until it expires",
					"identity", e.id.String(), "expires", c.NotAfter, "retry_in", wait, "error", err)
			} else {
				m.log.Warn("identity: certificate fetch failed", "identity", e.id.String(),
					"retry_in", wait, "error", err)
			}
		}
		close(e.changed)
		e.changed = make(chan struct{})
		e.mu.Unlock()

		t := time.NewTimer(wait)
		select {
		case <-e.ctx.Done():
			t.Stop()
			return
		case <-e.kick:
			t.Stop()
		case <-t.C:
		}
	}
}

// fetch makes a key and CSR, asks the CA and checks the answer.
func (m *Manager) fetch(ctx context.Context, id Identity) (*Certificate, error) {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-m.sem }()
	csr, key, err := GenerateCSR(id)
	if err != nil {
		m.metrics.fetchFailed(reasonCSR)
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	start := time.Now()
	chain, roots, err := m.ca.Sign(ctx, csr, id, m.ttl)
	m.metrics.fetched(time.Since(start))
	if err != nil {
		m.metrics.fetchFailed(reasonCA)
		return nil, err
	}
	cert, err := NewCertificate(id, key, chain, roots, time.Now())
	if err != nil {
		m.metrics.fetchFailed(reasonInvalid)
		return nil, err
	}
	return cert, nil
}

// renewDelay is how long after now a certificate fetched now is renewed:
// renewFraction (± renewJitter) of its life counted from now, or from
// NotBefore if that is later. Counting from now, not NotBefore, keeps a
// backdated NotBefore from pushing renewal past expiry on short TTLs.
func renewDelay(c *Certificate, now time.Time, r float64) time.Duration {
	start := c.NotBefore
	if now.After(start) {
		start = now
	}
	life := c.NotAfter.Sub(start)
	if life <= 0 {
		return retryInitial
	}
	frac := renewFraction + renewJitter*(2*r-1)
	return start.Add(time.Duration(float64(life) * frac)).Sub(now)
}

// jitter returns d scaled by a factor in [1-f, 1+f] picked by r in [0,1).
func jitter(d time.Duration, f, r float64) time.Duration {
	return time.Duration(float64(d) * (1 + f*(2*r-1)))
}

// Run forgets idle identities until ctx ends or Close is called, then closes
// the Manager. Calling it again while it runs only waits.
func (m *Manager) Run(ctx context.Context) error {
	defer m.Close()
	if !m.running.CompareAndSwap(false, true) || m.idle < 0 {
		select {
		case <-ctx.Done():
		case <-m.ctx.Done():
		}
		return nil
	}
	t := time.NewTicker(max(m.idle/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.ctx.Done():
			return nil
		case now := <-t.C:
			m.sweepIdle(now)
		}
	}
}

func (m *Manager) sweepIdle(now time.Time) {
	cutoff := now.Add(-m.idle).UnixNano()
	var idle []*entry
	m.mu.Lock()
	for id, e := range m.entries {
		if e.lastUsed.Load() < cutoff {
			idle = append(idle, e)
			delete(m.entries, id)
		}
	}
	m.mu.Unlock()
	for _, e := range idle {
		m.drop(e, ErrForgotten)
	}
}

// Close stops every renewal and fails waiting and later Gets with ErrClosed.
// It is safe to call more than once.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		entries := m.entries
		m.entries = make(map[Identity]*entry)
		m.mu.Unlock()
		m.cancel()
		for _, e := range entries {
			m.drop(e, ErrClosed)
		}
		m.wg.Wait()
	})
	return nil
}

// snapshot returns the managed entries (for Dump and metrics).
func (m *Manager) snapshot() []*entry {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*entry, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, e)
	}
	return out
}
