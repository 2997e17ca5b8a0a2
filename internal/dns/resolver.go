package dns

import (
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/internal/state"
)

// Defaults for ResolverOptions.
const (
	// DefaultForwardTimeout bounds one forwarded query over all upstream
	// resolvers. glibc waits 5 s per try by default; answering SERVFAIL well
	// before that lets the client move on (next search domain, next server)
	// instead of sitting out its own timeout.
	DefaultForwardTimeout = 2 * time.Second
	// DefaultMaxForwards caps forwards in flight per Resolver, so a
	// resolver that never answers cannot pile up goroutines and sockets
	// without bound (each lasts at most the forward timeout).
	DefaultMaxForwards = 1024
	// ttl of answers from the mesh, upstream's DEFAULT_TTL_SECONDS: short,
	// since VIPs change with xDS.
	ttl = 30
)

// ResolverOptions configure a Resolver. State is required.
type ResolverOptions struct {
	// State returns the current config snapshot.
	State func() *state.Snapshot
	// ClusterDomain completes short names (CLUSTER_DOMAIN); "" means
	// cluster.local.
	ClusterDomain string
	// Network is this node's network (NETWORK): only VIPs in it are given
	// out.
	Network string
	// SearchDomains are stripped from requested names to find mesh
	// hostnames. nil means the Kubernetes list for each client's namespace
	// (upstream's shared mode); dedicated mode passes resolv.conf's list.
	SearchDomains []string
	// Upstreams are "ip:port" resolvers for names outside the mesh, tried in
	// order; empty means such names get SERVFAIL.
	Upstreams []string
	// ForwardTimeout bounds one forward over all upstreams; 0 means
	// DefaultForwardTimeout.
	ForwardTimeout time.Duration
	// MaxForwards caps forwards in flight; 0 means DefaultMaxForwards.
	MaxForwards int
	// Metrics may be shared; nil creates unregistered ones.
	Metrics *Metrics
	// Logger gets one debug line per request and per error; nil discards.
	Logger *slog.Logger
}

// Resolver answers A and AAAA questions for mesh hostnames from state and
// forwards everything else. One Resolver serves every Server of a ztunnel;
// it holds no per-client state and is safe for concurrent use.
type Resolver struct {
	// immutable after NewResolver
	opts    ResolverOptions
	domains domains
	metrics *Metrics
	log     *slog.Logger
	slots   chan struct{} // forwards in flight

	hosts atomic.Pointer[hostIndex] // workloads by hostname, per snapshot version
}

// NewResolver checks opts and returns a Resolver.
func NewResolver(opts ResolverOptions) (*Resolver, error) {
	if opts.State == nil {
		return nil, errors.New("dns: new resolver: State is required")
	}
	if opts.ClusterDomain == "" {
		opts.ClusterDomain = "cluster.local"
	}
	if opts.ForwardTimeout <= 0 {
		opts.ForwardTimeout = DefaultForwardTimeout
	}
	if opts.MaxForwards <= 0 {
		opts.MaxForwards = DefaultMaxForwards
	}
	opts.SearchDomains = slices.Clone(opts.SearchDomains) // nil stays nil
	for i, s := range opts.SearchDomains {
		opts.SearchDomains[i] = normalize(s)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Resolver{
		opts:    opts,
		domains: newDomains(opts.ClusterDomain),
		metrics: opts.Metrics,
		log:     opts.Logger,
		slots:   make(chan struct{}, opts.MaxForwards),
	}, nil
}

// client is who asked: the pod a Server serves and, when the source
// address names it in state, its workload.
type client struct {
	namespace string
	workload  *state.Workload // may be nil
}

// meshMatch is a mesh hostname a question resolved to.
type meshMatch struct {
	service  *state.Service  // or
	workload *state.Workload // one of the two is set
	alias    alias
	wildcard bool
}

// find resolves a normalized name to a service or a workload of the mesh.
// Services are tried first for every alias and its wildcards, as upstream
// (Store::find_server); then workloads that have that hostname and an IP.
func (r *Resolver) find(snap *state.Snapshot, c client, name string) (meshMatch, bool) {
	search := r.opts.SearchDomains
	if search == nil {
		search = r.domains.kubeSearch(c.namespace)
	}
	as := r.domains.aliases(name, c.namespace, search)
	for _, a := range as {
		var m meshMatch
		wildcards(a.name, func(h string) bool {
			svc := snap.ServiceByHostname(h, c.namespace)
			if svc == nil || !r.answerable(svc) {
				return true
			}
			m = meshMatch{service: svc, alias: a, wildcard: strings.HasPrefix(h, "*.")}
			return false
		})
		if m.service != nil {
			return m, true
		}
	}
	idx := r.hostIndex(snap)
	for _, a := range as {
		if w := idx.find(a.name, c.namespace); w != nil {
			return meshMatch{workload: w, alias: a}, true
		}
	}
	return meshMatch{}, false
}

// answerable: a service without VIPs is answered only when it is a
// Kubernetes headless service (hostname under svc.<cluster domain>, answered
// with its endpoints' addresses); other VIP-less services (DNS-resolved
// ServiceEntries) are left to the upstream resolver, as upstream does.
// Upstream filters before ranking services that share a hostname; state
// ranks first here, which differs only when such a VIP-less service wins.
func (r *Resolver) answerable(svc *state.Service) bool {
	return len(svc.VIPs) > 0 || strings.HasSuffix(svc.Hostname, "."+r.domains.svc)
}

// familyOf maps a question type to the address family it asks for.
func familyOf(qtype uint16) (v4 bool) { return qtype == mdns.TypeA }

// addresses are the IPs of m a client may use for qtype, in random order
// (upstream shuffles to spread load over VIPs and endpoints).
func (r *Resolver) addresses(snap *state.Snapshot, m meshMatch, qtype uint16) []netip.Addr {
	v4 := familyOf(qtype)
	ok := func(ip netip.Addr) bool { return ip.Is4() == v4 }
	var out []netip.Addr
	switch {
	case m.workload != nil:
		for _, ip := range m.workload.IPs {
			if ok(ip) {
				out = append(out, ip)
			}
		}
	case !familyAllowed(m.service, v4):
		// An IPv4-only service has no AAAA (and the reverse), even when its
		// endpoints are dual stack: answer empty, not NXDOMAIN.
	case len(m.service.VIPs) > 0:
		for _, vip := range m.service.VIPs {
			if vip.Network == r.opts.Network && ok(vip.Addr) {
				out = append(out, vip.Addr)
			}
		}
	default: // headless: one address of the family per endpoint
		for _, ep := range snap.Endpoints(m.service) {
			for _, ip := range ep.Workload.IPs {
				if ok(ip) {
					out = append(out, ip)
					break
				}
			}
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func familyAllowed(svc *state.Service, v4 bool) bool {
	switch svc.IPFamilies {
	case state.IPFamiliesIPv4Only:
		return v4
	case state.IPFamiliesIPv6Only:
		return !v4
	}
	return true
}

// meshAnswer builds the authoritative answer to req for m: a CNAME from the
// requested name to the stripped one when a search domain was removed (not
// for wildcard matches), then one A or AAAA per address. No address of the
// family is an empty NOERROR answer: the name exists.
func (r *Resolver) meshAnswer(snap *state.Snapshot, req *mdns.Msg, m meshMatch) *mdns.Msg {
	q := req.Question[0]
	resp := new(mdns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	resp.RecursionAvailable = true
	owner := q.Name
	if m.alias.stripped != "" && !m.wildcard {
		target := mdns.Fqdn(m.alias.stripped)
		resp.Answer = append(resp.Answer, &mdns.CNAME{
			Hdr:    mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeCNAME, Class: mdns.ClassINET, Ttl: ttl},
			Target: target,
		})
		owner = target
	}
	for _, ip := range r.addresses(snap, m, q.Qtype) {
		hdr := mdns.RR_Header{Name: owner, Rrtype: q.Qtype, Class: mdns.ClassINET, Ttl: ttl}
		if ip.Is4() {
			resp.Answer = append(resp.Answer, &mdns.A{Hdr: hdr, A: ip.AsSlice()})
		} else {
			resp.Answer = append(resp.Answer, &mdns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
	}
	return resp
}

// hostIndex maps workload hostnames to the workloads that have one and at
// least one IP, for one snapshot version. Built lazily on the first lookup
// that needs it after a change, and shared by every Server.
type hostIndex struct {
	version uint64
	byHost  map[string][]*state.Workload
}

func (r *Resolver) hostIndex(snap *state.Snapshot) *hostIndex {
	if idx := r.hosts.Load(); idx != nil && idx.version == snap.Version() {
		return idx
	}
	idx := &hostIndex{version: snap.Version(), byHost: map[string][]*state.Workload{}}
	for _, w := range snap.Workloads() {
		if w.Hostname != "" && len(w.IPs) > 0 {
			h := normalize(w.Hostname)
			idx.byHost[h] = append(idx.byHost[h], w)
		}
	}
	r.hosts.Store(idx)
	return idx
}

// find returns the workload with hostname h, preferring one in the
// client's namespace.
func (idx *hostIndex) find(h, ns string) *state.Workload {
	ws := idx.byHost[h]
	for _, w := range ws {
		if w.Namespace == ns {
			return w
		}
	}
	if len(ws) > 0 {
		return ws[0]
	}
	return nil
}
