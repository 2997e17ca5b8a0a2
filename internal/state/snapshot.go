package state

import (
	"iter"
	"net/netip"
	"slices"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
)

// Snapshot is an immutable view of the store. Every method is safe for
// concurrent use and takes no lock; values it returns are shared and must
// not be modified.
type Snapshot struct {
	version       uint64
	policyVersion uint64
	// changed is closed when a newer snapshot is published.
	changed chan struct{}

	workloads map[string]*Workload // by uid
	// byAddr holds, per address, every non-host-network workload with that
	// IP in insertion order; lookups rank them (see WorkloadByAddr).
	byAddr   map[NetworkAddress][]*Workload
	services map[string]*Service // by "namespace/hostname"
	// byHost and byVIP hold at most one service per namespace each.
	byHost   map[string][]*Service
	byVIP    map[NetworkAddress][]*Service
	cidrVIPs []cidrVIP
	// endpoints is keyed by service key whether or not that service is known
	// yet, so workloads that arrive first need no staging.
	endpoints map[string]*endpointList
	policies  map[string]*rbac.Policy // by "namespace/name"
	// byScope maps a namespace to its Namespace-scoped policies and "" to
	// the Global ones, each list sorted by key.
	byScope map[string][]*rbac.Policy
}

type cidrVIP struct {
	prefix  NetworkPrefix
	service *Service
}

// endpointList is one service's endpoints sorted by workload uid.
type endpointList struct {
	all     []*Endpoint
	healthy []*Endpoint
}

func emptySnapshot() *Snapshot {
	return &Snapshot{
		changed:   make(chan struct{}),
		workloads: map[string]*Workload{},
		byAddr:    map[NetworkAddress][]*Workload{},
		services:  map[string]*Service{},
		byHost:    map[string][]*Service{},
		byVIP:     map[NetworkAddress][]*Service{},
		endpoints: map[string]*endpointList{},
		policies:  map[string]*rbac.Policy{},
		byScope:   map[string][]*rbac.Policy{},
	}
}

// Version counts published snapshots; it grows by one per applied change.
func (s *Snapshot) Version() uint64 { return s.version }

// PolicyVersion grows only when the set of policies changes (for re-running
// authorization on open connections).
func (s *Snapshot) PolicyVersion() uint64 { return s.policyVersion }

// Changed is closed once a newer snapshot has replaced s. Waiters reload
// with Store.Snapshot; many changes in a row wake them once.
func (s *Snapshot) Changed() <-chan struct{} { return s.changed }

// Counts returns how many workloads, services and policies s holds.
func (s *Snapshot) Counts() (workloads, services, policies int) {
	return len(s.workloads), len(s.services), len(s.policies)
}

// WorkloadByUID returns the workload with that uid, or nil.
func (s *Snapshot) WorkloadByUID(uid string) *Workload { return s.workloads[uid] }

// WorkloadByAddr returns the workload that has ip in network, or nil.
// Host-network workloads are never returned. When several workloads share
// an address, upstream's ranking decides: a Pod over anything else, then
// HBONE over TCP, then the one added last.
func (s *Snapshot) WorkloadByAddr(network string, ip netip.Addr) *Workload {
	ws := s.byAddr[NetworkAddress{Network: network, Addr: ip}]
	var best *Workload
	bestRank := -1
	for _, w := range ws {
		r := 0
		if strings.Contains(w.UID, "//Pod/") {
			r += 2
		}
		if w.Protocol == ProtocolHBONE {
			r++
		}
		if r >= bestRank {
			best, bestRank = w, r
		}
	}
	return best
}

// Workloads returns every workload sorted by uid.
func (s *Snapshot) Workloads() []*Workload {
	return sortedValues(s.workloads)
}

// Service returns the service with key "namespace/hostname", or nil.
func (s *Snapshot) Service(key string) *Service { return s.services[key] }

// ServiceByHostname resolves name, either "namespace/hostname" (exact) or a
// bare hostname. For a bare hostname the best of the services sharing it is
// returned for a client in clientNS (see ServiceByVIP for the ranking);
// clientNS "" means no client namespace is known.
func (s *Snapshot) ServiceByHostname(name, clientNS string) *Service {
	if strings.Contains(name, "/") {
		return s.services[name]
	}
	return bestService(s.byHost[name], clientNS)
}

// ServiceByVIP returns the service that has ip as a VIP in network, or, if
// none, the one whose CIDR VIP contains it. Among several candidates,
// upstream's ranking applies: services invisible to clientNS are skipped; a
// service in clientNS wins, then a canonical one, then the first added. For
// CIDR VIPs: in clientNS first, then the longest prefix, then canonical.
func (s *Snapshot) ServiceByVIP(network string, ip netip.Addr, clientNS string) *Service {
	if svc := bestService(s.byVIP[NetworkAddress{Network: network, Addr: ip}], clientNS); svc != nil {
		return svc
	}
	var best *Service
	var bestRank [3]int
	for _, c := range s.cidrVIPs {
		if c.prefix.Network != network || !c.prefix.Prefix.Contains(ip) || !c.service.VisibleTo(clientNS) {
			continue
		}
		rank := [3]int{b2i(clientNS != "" && c.service.Namespace == clientNS), c.prefix.Prefix.Bits(), b2i(c.service.Canonical)}
		if best == nil || slices.Compare(rank[:], bestRank[:]) > 0 {
			best, bestRank = c.service, rank
		}
	}
	return best
}

func bestService(svcs []*Service, clientNS string) *Service {
	var first, canonical *Service
	for _, svc := range svcs {
		if !svc.VisibleTo(clientNS) {
			continue
		}
		if clientNS != "" && svc.Namespace == clientNS {
			return svc
		}
		if svc.Canonical {
			canonical = svc
		}
		if first == nil {
			first = svc
		}
	}
	if canonical != nil {
		return canonical
	}
	return first
}

// Services returns every service sorted by hostname, then namespace.
func (s *Snapshot) Services() []*Service {
	out := make([]*Service, 0, len(s.services))
	for _, svc := range s.services {
		out = append(out, svc)
	}
	slices.SortFunc(out, func(a, b *Service) int {
		if c := strings.Compare(a.Hostname, b.Hostname); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace, b.Namespace)
	})
	return out
}

// ServicesOf returns the known services w backs, sorted by key.
func (s *Snapshot) ServicesOf(w *Workload) []*Service {
	var out []*Service
	for k := range w.Services {
		if svc := s.services[k]; svc != nil {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b *Service) int { return strings.Compare(a.Key(), b.Key()) })
	return out
}

// Endpoints returns the workloads backing svc, sorted by uid: the healthy
// ones, or all of them when svc's health policy is AllowAll.
func (s *Snapshot) Endpoints(svc *Service) []*Endpoint {
	l := s.endpoints[svc.Key()]
	if l == nil {
		return nil
	}
	if svc.IncludesUnhealthy() {
		return l.all
	}
	return l.healthy
}

// FindAddress resolves ip in network to a workload, or failing that to a
// service VIP (upstream's order for an address).
func (s *Snapshot) FindAddress(network string, ip netip.Addr, clientNS string) Address {
	if w := s.WorkloadByAddr(network, ip); w != nil {
		return Address{Workload: w}
	}
	if svc := s.ServiceByVIP(network, ip, clientNS); svc != nil {
		return Address{Service: svc}
	}
	return Address{}
}

// FindHostname resolves a namespaced hostname to a service, or failing that
// to a workload with that hostname in that namespace (a linear scan, as
// upstream does: this path is rare).
func (s *Snapshot) FindHostname(n NamespacedHostname) Address {
	if svc := s.services[n.String()]; svc != nil {
		return Address{Service: svc}
	}
	for _, w := range s.workloads {
		if w.Hostname == n.Hostname && w.Namespace == n.Namespace {
			return Address{Workload: w}
		}
	}
	return Address{}
}

// Policy returns the policy with key "namespace/name", or nil.
func (s *Snapshot) Policy(key string) *rbac.Policy { return s.policies[key] }

// Policies returns every policy sorted by key.
func (s *Snapshot) Policies() []*rbac.Policy { return sortedValues(s.policies) }

// PoliciesFor yields the policies that apply to w, each once, in upstream's
// order: Namespace-scoped policies of w's namespace, then Global ones, then
// those w names in AuthorizationPolicies (names not known are skipped, as
// upstream does while a policy is in flight). It allocates nothing.
func (s *Snapshot) PoliciesFor(w *Workload) iter.Seq[*rbac.Policy] {
	return func(yield func(*rbac.Policy) bool) {
		for _, p := range s.byScope[w.Namespace] {
			if !yield(p) {
				return
			}
		}
		for _, p := range s.byScope[""] {
			if !yield(p) {
				return
			}
		}
		for i, k := range w.AuthorizationPolicies {
			p := s.policies[k]
			if p == nil || s.scopeSelects(p, w) || slices.Contains(w.AuthorizationPolicies[:i], k) {
				continue // unknown, or already yielded above
			}
			if !yield(p) {
				return
			}
		}
	}
}

// scopeSelects reports whether p was already yielded by scope for w.
func (s *Snapshot) scopeSelects(p *rbac.Policy, w *Workload) bool {
	switch p.Scope {
	case rbac.ScopeGlobal:
		return true
	case rbac.ScopeNamespace:
		return p.Namespace == w.Namespace
	}
	return false
}

func sortedValues[V any](m map[string]*V) []*V {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]*V, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
