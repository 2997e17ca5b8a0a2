package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/state"
)

// counters are a live connection's byte totals, in upstream's (and Istio's)
// sense: received is what the client sent (downstream → upstream), sent is
// what went back (upstream → downstream).
type counters struct {
	received atomic.Int64
	sent     atomic.Int64
}

// record accounts for one proxied connection: exactly one "opened" and one
// "closed" metric update and one access log line, whatever path it ends on.
// Use: rec := p.newRecord(...); defer rec.done(&err).
type record struct {
	m      *Metrics
	log    *slog.Logger
	start  time.Time
	labels TrafficLabels
	// The connection's series, looked up at open: a pointer held per live
	// connection instead of the 23 label values (384 bytes), and a flush
	// adds to them without hashing the values again.
	series *trafficSeries

	direction string // "outbound" | "inbound"
	src, dst  netip.AddrPort
	hbone     string // HBONE target address, "" for plain TCP

	counts counters
	opened bool

	// flushMu serialises folding byte counts into the metrics (the periodic
	// flush and done may race); reported is what was already added.
	flushMu      sync.Mutex
	reportedSent int64
	reportedRecv int64
}

func newRecord(m *Metrics, log *slog.Logger, direction string, src, dst netip.AddrPort) *record {
	return &record{m: m, log: log, start: time.Now(), direction: direction, src: src, dst: dst}
}

// open marks the connection established with its final labels.
func (r *record) open(l TrafficLabels) {
	r.labels = l
	r.opened = true
	r.series = r.m.seriesFor(&r.labels)
	r.series.opened.Inc()
	r.m.live.Add(1)
}

// done folds the byte counts into the metrics and writes the access log.
// A connection that never opened counts as failed.
func (r *record) done(errp *error) {
	var err error
	if errp != nil {
		err = *errp
	}
	recv, sent := r.counts.received.Load(), r.counts.sent.Load()
	if r.opened {
		r.series.closed.Inc()
		r.m.live.Add(-1)
		r.flush()
	} else {
		r.m.failed.WithLabelValues(r.labels.values()...).Inc()
	}
	// A failed connection is logged at WARN, so it still shows when the
	// level hides the INFO line of every clean one.
	level := slog.LevelInfo
	if err != nil && !isBenign(err) {
		level = slog.LevelWarn
	}
	ctx := context.Background()
	h := r.log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("src.addr", r.src.String()),
		slog.String("src.workload", r.labels.SourceWorkload),
		slog.String("src.namespace", r.labels.SourceNamespace),
		slog.String("src.identity", r.labels.SourcePrincipal),
		slog.String("dst.addr", r.dst.String()),
	}
	if r.hbone != "" {
		attrs = append(attrs, slog.String("dst.hbone_addr", r.hbone))
	}
	attrs = append(attrs,
		slog.String("dst.service", r.labels.DestinationService),
		slog.String("dst.workload", r.labels.DestinationWorkload),
		slog.String("dst.namespace", r.labels.DestinationNamespace),
		slog.String("dst.identity", r.labels.DestinationPrincipal),
		slog.String("direction", r.direction),
		slog.Int64("bytes_sent", sent),
		slog.Int64("bytes_recv", recv),
		slog.Duration("duration", time.Since(r.start).Round(time.Microsecond)),
	)
	if level == slog.LevelWarn {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	// The record is built here, not by Logger.LogAttrs: that one also
	// unwinds the stack for the caller's PC (runtime.Callers), which no
	// handler here prints, on every connection, paging in the function
	// tables it walks.
	rec := slog.NewRecord(time.Now(), level, "connection complete", 0)
	rec.AddAttrs(attrs...)
	_ = h.Handle(ctx, rec)
}

// flush adds the bytes moved since the last flush to the byte counters, so
// long-lived connections show up in istio_tcp_*_bytes_total while they run
// (upstream updates them live), spliced TCP-to-TCP copies included.
func (r *record) flush() {
	if !r.opened {
		return
	}
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	recv, sent := r.counts.received.Load(), r.counts.sent.Load()
	if d := recv - r.reportedRecv; d > 0 {
		r.series.received.Add(float64(d))
		r.reportedRecv = recv
	}
	if d := sent - r.reportedSent; d > 0 {
		r.series.sent.Add(float64(d))
		r.reportedSent = sent
	}
}

// isBenign reports errors that are the normal end of a connection.
func isBenign(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled)
}

// tracked is a live connection the tracker can close: on drain, or when a
// policy change now denies it.
type tracked struct {
	// rec, if set, is flushed periodically into the byte metrics.
	rec   *record
	close func()
	// policy re-evaluates whether the connection is still allowed; nil
	// means policy does not apply (outbound).
	policy *policyCheck
}

// tracker holds every live proxied connection of one proxy instance, and
// counts the ones still being set up (accepted, upstream not yet connected)
// so that a drain waits for them too.
//
// The count is a plain integer under mu, not a sync.WaitGroup: an HBONE
// stream (or an accept that raced the listener's close) may begin while a
// drain already waits at a count of zero, and a WaitGroup forbids exactly
// that Add (the race detector saw it during shutdown). Here such a
// connection is simply counted, and the drain waits for it as well.
type tracker struct {
	mu      sync.Mutex
	conns   map[*tracked]struct{} // guarded by mu
	closing bool                  // guarded by mu: drain has given up waiting; add closes at once
	active  int                   // guarded by mu: tracked connections and set-ups in progress
	idle    chan struct{}         // guarded by mu: closed when active drops to zero; nil if nobody waits
}

func newTracker() *tracker { return &tracker{conns: map[*tracked]struct{}{}} }

// begin counts a connection being set up; call the returned func exactly
// once, when its handler returns.
func (t *tracker) begin() (end func()) {
	t.mu.Lock()
	t.active++
	t.mu.Unlock()
	return t.release
}

func (t *tracker) release() {
	t.mu.Lock()
	t.releaseLocked()
	t.mu.Unlock()
}

func (t *tracker) releaseLocked() {
	t.active--
	if t.active == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// idleCh returns a channel closed once nothing is active.
func (t *tracker) idleCh() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	return t.idle
}

// add tracks c until the returned func is called. After a drain gave up
// waiting (or finished), c is closed at once: nothing would close it later.
func (t *tracker) add(c *tracked) func() {
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		c.close()
		return func() {}
	}
	t.conns[c] = struct{}{}
	t.active++
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		if _, ok := t.conns[c]; ok {
			delete(t.conns, c)
			t.releaseLocked()
		}
		t.mu.Unlock()
	}
}

func (t *tracker) snapshot() []*tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*tracked, 0, len(t.conns))
	for c := range t.conns {
		out = append(out, c)
	}
	return out
}

// len is the number of live connections.
func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// reevaluate closes every connection that snap's policy no longer allows
// and returns how many it closed.
func (t *tracker) reevaluate(snap *state.Snapshot) int {
	n := 0
	for _, c := range t.snapshot() {
		if c.policy != nil && !c.policy.allowed(snap) {
			c.close()
			n++
		}
	}
	return n
}

// flush folds every live connection's byte counts into the metrics.
func (t *tracker) flush() {
	for _, c := range t.snapshot() {
		if c.rec != nil {
			c.rec.flush()
		}
	}
}

// drain waits for connections (and set-ups in progress) to finish until
// ctx ends; then it calls abortSetup, so that pending upstream connects
// fail, closes every tracked connection, and waits for all handlers to
// return. A connection whose set-up completes after that is closed by add.
func (t *tracker) drain(ctx context.Context, abortSetup func()) {
	select {
	case <-t.idleCh():
	case <-ctx.Done():
	}
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	abortSetup()
	for _, c := range t.snapshot() {
		c.close()
	}
	<-t.idleCh()
}
