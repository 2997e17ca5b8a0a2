package state

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/rbac"
)

// builder makes the next snapshot from the current one. It copies a map the
// first time it writes to it and shares everything it does not touch. It is
// used only with Store.mu held.
type builder struct {
	old  *Snapshot
	next Snapshot

	// Which of next's maps are already private copies.
	ownWorkloads, ownByAddr, ownServices, ownByHost, ownByVIP, ownCIDR bool
	ownPolicies, ownByScope                                            bool

	// epChanges holds, per service key, the endpoints to set (nil value =
	// remove) by workload uid; applied once per service in finish.
	epChanges map[string]map[string]*Endpoint

	addressesChanged, policiesChanged bool
}

func newBuilder(old *Snapshot) *builder {
	b := &builder{old: old, next: *old}
	b.next.changed = nil
	return b
}

// own returns a private copy of *m the first time it is called per map.
func own[K comparable, V any](m *map[K]V, owned *bool) map[K]V {
	if !*owned {
		c := make(map[K]V, len(*m)+1)
		maps.Copy(c, *m)
		*m, *owned = c, true
	}
	return *m
}

// putWorkload adds or replaces w, replacing a service of the same name.
func (b *builder) putWorkload(w *Workload) {
	b.removeWorkload(w.UID)
	b.removeService(w.UID)
	own(&b.next.workloads, &b.ownWorkloads)[w.UID] = w
	if w.NetworkMode != NetworkModeHostNetwork {
		byAddr := own(&b.next.byAddr, &b.ownByAddr)
		for _, ip := range w.IPs {
			k := NetworkAddress{Network: w.Network, Addr: ip}
			byAddr[k] = append(slices.Clip(byAddr[k]), w)
		}
	}
	for svc, ports := range w.Services {
		b.endpointChange(svc, w.UID, &Endpoint{Workload: w, Ports: ports})
	}
	b.addressesChanged = true
}

// removeWorkload removes the workload uid if there is one.
func (b *builder) removeWorkload(uid string) bool {
	prev := b.next.workloads[uid]
	if prev == nil {
		return false
	}
	delete(own(&b.next.workloads, &b.ownWorkloads), uid)
	if prev.NetworkMode != NetworkModeHostNetwork {
		byAddr := own(&b.next.byAddr, &b.ownByAddr)
		for _, ip := range prev.IPs {
			k := NetworkAddress{Network: prev.Network, Addr: ip}
			rest := slices.DeleteFunc(slices.Clone(byAddr[k]), func(w *Workload) bool { return w.UID == uid })
			if len(rest) == 0 {
				delete(byAddr, k)
			} else {
				byAddr[k] = rest
			}
		}
	}
	for svc := range prev.Services {
		b.endpointChange(svc, uid, nil)
	}
	b.addressesChanged = true
	return true
}

func (b *builder) endpointChange(svc, uid string, ep *Endpoint) {
	if b.epChanges == nil {
		b.epChanges = map[string]map[string]*Endpoint{}
	}
	m := b.epChanges[svc]
	if m == nil {
		m = map[string]*Endpoint{}
		b.epChanges[svc] = m
	}
	m[uid] = ep
}

// putService adds or replaces svc, replacing a workload of the same name.
func (b *builder) putService(svc *Service) {
	key := svc.Key()
	b.removeService(key)
	b.removeWorkload(key)
	own(&b.next.services, &b.ownServices)[key] = svc
	byHost := own(&b.next.byHost, &b.ownByHost)
	byHost[svc.Hostname] = withService(byHost[svc.Hostname], svc)
	if len(svc.VIPs) > 0 {
		byVIP := own(&b.next.byVIP, &b.ownByVIP)
		for _, vip := range svc.VIPs {
			byVIP[vip] = withService(byVIP[vip], svc)
		}
	}
	if len(svc.CIDRVIPs) > 0 {
		b.ownCIDRs()
		for _, p := range svc.CIDRVIPs {
			b.next.cidrVIPs = append(b.next.cidrVIPs, cidrVIP{prefix: p, service: svc})
		}
	}
	b.addressesChanged = true
}

// withService returns a new list with svc in place of the entry for the
// same namespace, or appended.
func withService(list []*Service, svc *Service) []*Service {
	out := slices.Clone(list)
	for i, s := range out {
		if s.Namespace == svc.Namespace {
			out[i] = svc
			return out
		}
	}
	return append(out, svc)
}

// removeService removes the service key if there is one.
func (b *builder) removeService(key string) bool {
	prev := b.next.services[key]
	if prev == nil {
		return false
	}
	delete(own(&b.next.services, &b.ownServices), key)
	same := func(s *Service) bool { return s.Key() == key }
	byHost := own(&b.next.byHost, &b.ownByHost)
	if rest := slices.DeleteFunc(slices.Clone(byHost[prev.Hostname]), same); len(rest) == 0 {
		delete(byHost, prev.Hostname)
	} else {
		byHost[prev.Hostname] = rest
	}
	if len(prev.VIPs) > 0 {
		byVIP := own(&b.next.byVIP, &b.ownByVIP)
		for _, vip := range prev.VIPs {
			if rest := slices.DeleteFunc(slices.Clone(byVIP[vip]), same); len(rest) == 0 {
				delete(byVIP, vip)
			} else {
				byVIP[vip] = rest
			}
		}
	}
	if len(prev.CIDRVIPs) > 0 {
		b.ownCIDRs()
		b.next.cidrVIPs = slices.DeleteFunc(b.next.cidrVIPs, func(c cidrVIP) bool { return c.service.Key() == key })
	}
	b.addressesChanged = true
	return true
}

func (b *builder) ownCIDRs() {
	if !b.ownCIDR {
		b.next.cidrVIPs = slices.Clone(b.next.cidrVIPs)
		b.ownCIDR = true
	}
}

// removeAddress removes whatever the Address resource name names.
func (b *builder) removeAddress(name string) {
	if !b.removeWorkload(name) {
		b.removeService(name)
	}
}

func (b *builder) putPolicy(key string, p *rbac.Policy) {
	b.removePolicy(key)
	own(&b.next.policies, &b.ownPolicies)[key] = p
	if scope, ok := scopeKey(p); ok {
		byScope := own(&b.next.byScope, &b.ownByScope)
		list := append(slices.Clone(byScope[scope]), p)
		slices.SortFunc(list, func(x, y *rbac.Policy) int { return strings.Compare(x.Key(), y.Key()) })
		byScope[scope] = list
	}
	b.policiesChanged = true
}

func (b *builder) removePolicy(key string) {
	prev := b.next.policies[key]
	if prev == nil {
		return
	}
	delete(own(&b.next.policies, &b.ownPolicies), key)
	if scope, ok := scopeKey(prev); ok {
		byScope := own(&b.next.byScope, &b.ownByScope)
		rest := slices.DeleteFunc(slices.Clone(byScope[scope]), func(x *rbac.Policy) bool { return x == prev })
		if len(rest) == 0 {
			delete(byScope, scope)
		} else {
			byScope[scope] = rest
		}
	}
	b.policiesChanged = true
}

// scopeKey is where p is indexed by scope: "" for Global, its namespace for
// Namespace; WorkloadSelector policies apply only where a workload names them.
func scopeKey(p *rbac.Policy) (string, bool) {
	switch p.Scope {
	case rbac.ScopeGlobal:
		return "", true
	case rbac.ScopeNamespace:
		return p.Namespace, true
	}
	return "", false
}

// finish returns the next snapshot, or nil when nothing changed.
func (b *builder) finish() *Snapshot {
	if !b.addressesChanged && !b.policiesChanged {
		return nil
	}
	if len(b.epChanges) > 0 {
		eps := maps.Clone(b.next.endpoints)
		for svc, changes := range b.epChanges {
			if l := mergeEndpoints(eps[svc], changes); l == nil {
				delete(eps, svc)
			} else {
				eps[svc] = l
			}
		}
		b.next.endpoints = eps
	}
	next := b.next
	next.version = b.old.version + 1
	if b.policiesChanged {
		next.policyVersion = b.old.policyVersion + 1
	}
	next.changed = make(chan struct{})
	return &next
}

// mergeEndpoints applies changes to old (either may be empty) and returns
// the new sorted list, or nil when it is empty.
func mergeEndpoints(old *endpointList, changes map[string]*Endpoint) *endpointList {
	var all []*Endpoint
	if old != nil {
		all = make([]*Endpoint, 0, len(old.all)+len(changes))
		for _, ep := range old.all {
			if _, changed := changes[ep.Workload.UID]; !changed {
				all = append(all, ep)
			}
		}
	}
	for _, ep := range changes {
		if ep != nil {
			all = append(all, ep)
		}
	}
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(x, y *Endpoint) int { return cmp.Compare(x.Workload.UID, y.Workload.UID) })
	l := &endpointList{all: all, healthy: all}
	for i, ep := range all {
		if ep.Workload.Status != Healthy {
			// Copy only when some endpoint is unhealthy.
			l.healthy = slices.Clone(all[:i])
			for _, ep := range all[i+1:] {
				if ep.Workload.Status == Healthy {
					l.healthy = append(l.healthy, ep)
				}
			}
			break
		}
	}
	return l
}
