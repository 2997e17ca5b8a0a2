package state

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// Options configures a Store.
type Options struct {
	// Logger receives one line per rejected resource and per applied change
	// (debug). Nil discards.
	Logger *slog.Logger
	// Registerer receives the store's metrics. Nil means no metrics.
	Registerer prometheus.Registerer
}

// Store holds the current Snapshot and applies xDS updates to it. It
// satisfies the internal/xds Handler interface. Use New.
type Store struct {
	// Immutable after New.
	log      *slog.Logger
	rejected *prometheus.CounterVec // nil without a Registerer

	// cur is the published snapshot; readers only Load it.
	cur atomic.Pointer[Snapshot]

	// mu serializes writers; it is held only while the next snapshot is
	// built from already validated resources, never during conversion.
	mu sync.Mutex
}

// New returns an empty Store (version 0).
func New(opts Options) (*Store, error) {
	s := &Store{log: opts.Logger}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Registerer != nil {
		s.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_state_rejected_resources_total",
			Help: "xDS resources rejected by validation, by resource type and reason.",
		}, []string{"type", "reason"})
		if err := opts.Registerer.Register(s.rejected); err != nil {
			return nil, fmt.Errorf("state: register metrics: %w", err)
		}
	}
	s.cur.Store(emptySnapshot())
	return s, nil
}

// Snapshot returns the current snapshot. It never blocks.
func (s *Store) Snapshot() *Snapshot { return s.cur.Load() }

// UpdateAddresses inserts or replaces the valid upserts, then removes the
// named resources. Rejected upserts are returned by name; their previous
// value (if any) stays.
func (s *Store) UpdateAddresses(upserts map[string]*workloadpb.Address, removes []string) map[string]error {
	conv, rejected := s.convertAddresses(upserts)
	s.mu.Lock()
	b := newBuilder(s.cur.Load())
	putAddresses(b, conv)
	for _, name := range removes {
		b.removeAddress(name)
	}
	s.publishLocked(b)
	s.mu.Unlock()
	return rejected
}

// ReplaceAddresses makes all the whole Address state: resources not named
// are removed; rejected ones keep their previous value.
func (s *Store) ReplaceAddresses(all map[string]*workloadpb.Address) map[string]error {
	conv, rejected := s.convertAddresses(all)
	s.mu.Lock()
	old := s.cur.Load()
	b := newBuilder(old)
	for _, name := range sortedKeys(old.workloads) {
		if _, keep := all[name]; !keep {
			b.removeWorkload(name)
		}
	}
	for _, name := range sortedKeys(old.services) {
		if _, keep := all[name]; !keep {
			b.removeService(name)
		}
	}
	putAddresses(b, conv)
	s.publishLocked(b)
	s.mu.Unlock()
	return rejected
}

// UpdateAuthorizations inserts or replaces the valid upserts, then removes
// the named policies.
func (s *Store) UpdateAuthorizations(upserts map[string]*securitypb.Authorization, removes []string) map[string]error {
	conv, rejected := s.convertPolicies(upserts)
	s.mu.Lock()
	b := newBuilder(s.cur.Load())
	for _, name := range sortedKeys(conv) {
		b.putPolicy(name, conv[name])
	}
	for _, name := range removes {
		b.removePolicy(name)
	}
	s.publishLocked(b)
	s.mu.Unlock()
	return rejected
}

// ReplaceAuthorizations makes all the whole policy state.
func (s *Store) ReplaceAuthorizations(all map[string]*securitypb.Authorization) map[string]error {
	conv, rejected := s.convertPolicies(all)
	s.mu.Lock()
	old := s.cur.Load()
	b := newBuilder(old)
	for _, name := range sortedKeys(old.policies) {
		if _, keep := all[name]; !keep {
			b.removePolicy(name)
		}
	}
	for _, name := range sortedKeys(conv) {
		b.putPolicy(name, conv[name])
	}
	s.publishLocked(b)
	s.mu.Unlock()
	return rejected
}

// putAddresses applies converted resources in name order, so that which of
// two workloads sharing an IP was "added last" does not depend on map order.
func putAddresses(b *builder, conv map[string]converted) {
	for _, name := range sortedKeys(conv) {
		c := conv[name]
		if c.workload != nil {
			b.putWorkload(c.workload)
		} else {
			b.putService(c.service)
		}
	}
}

// publishLocked stores b's snapshot, if anything changed, and wakes waiters
// on the one it replaces.
func (s *Store) publishLocked(b *builder) {
	next := b.finish()
	if next == nil {
		return
	}
	s.cur.Store(next)
	close(b.old.changed)
	s.log.Debug("state: published snapshot", "version", next.version,
		"workloads", len(next.workloads), "services", len(next.services), "policies", len(next.policies))
}

func (s *Store) convertAddresses(in map[string]*workloadpb.Address) (map[string]converted, map[string]error) {
	out := make(map[string]converted, len(in))
	var rejected map[string]error
	for name, a := range in {
		c, err := convertAddress(name, a)
		if err != nil {
			rejected = s.reject(rejected, name, err)
			continue
		}
		out[name] = c
	}
	return out, rejected
}

func (s *Store) convertPolicies(in map[string]*securitypb.Authorization) (map[string]*rbac.Policy, map[string]error) {
	out := make(map[string]*rbac.Policy, len(in))
	var rejected map[string]error
	for name, a := range in {
		p, err := convertPolicy(name, a)
		if err != nil {
			rejected = s.reject(rejected, name, err)
		}
		if p != nil {
			out[name] = p
		}
	}
	return out, rejected
}

func (s *Store) reject(m map[string]error, name string, err *RejectError) map[string]error {
	if m == nil {
		m = map[string]error{}
	}
	m[name] = err
	s.log.Warn("state: rejected resource", "type", err.Kind, "name", name, "reason", err.Reason.Label(), "error", err.Error())
	if s.rejected != nil {
		s.rejected.WithLabelValues(err.Kind, err.Reason.Label()).Inc()
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
