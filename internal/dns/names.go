package dns

import "strings"

// Names here are lower case, without the trailing dot, as state stores
// hostnames.

// alias is one name a request may mean (upstream's Alias).
type alias struct {
	name string
	// stripped is set when the alias came from removing a search domain
	// from the requested name; an answer then carries a CNAME from the
	// requested name to stripped.
	stripped string
}

// normalize lower-cases a query name and removes its trailing dot.
func normalize(qname string) string {
	return strings.ToLower(strings.TrimSuffix(qname, "."))
}

// countLabels counts the labels of a normalized name ("" has none).
func countLabels(name string) int {
	if name == "" {
		return 0
	}
	return strings.Count(name, ".") + 1
}

// hasDomain reports whether name ends with domain and has labels before it
// (upstream name_util::has_domain).
func hasDomain(name, domain string) bool {
	return len(name) > len(domain)+1 && strings.HasSuffix(name, domain) && name[len(name)-len(domain)-1] == '.'
}

// trimDomain removes domain from the end of name; ok is false when name is
// not under domain or nothing would be left.
func trimDomain(name, domain string) (string, bool) {
	if !hasDomain(name, domain) {
		return "", false
	}
	return name[:len(name)-len(domain)-1], true
}

// domains are the suffixes a client's short names are completed with.
type domains struct {
	cluster string // cluster.local
	svc     string // svc.cluster.local
}

func newDomains(cluster string) domains {
	cluster = normalize(cluster)
	return domains{cluster: cluster, svc: "svc." + cluster}
}

// namespaced is "<ns>.svc.<cluster domain>".
func (d domains) namespaced(ns string) string { return ns + "." + d.svc }

// kubeSearch is the search list Kubernetes gives a pod in namespace ns;
// upstream assumes it for every pod in shared mode (ztunnel issue 555).
func (d domains) kubeSearch(ns string) []string {
	return []string{d.namespaced(ns), d.svc, d.cluster}
}

// kubeFQDNs expands name into the Kubernetes FQDNs it can stand for, from a
// client in namespace ns (upstream Store::to_kube_fqdns):
//
//	svc            → svc.<ns>.svc.<domain>
//	svc.ns         → svc.ns.svc.<domain>, svc.ns.<ns>.svc.<domain> (pod.subdomain)
//	svc.ns.svc     → svc.ns.svc.<domain>, svc.ns.svc.svc.<domain>
//	pod.sub.ns     → pod.sub.ns.svc.<domain>
//	pod.sub.ns.svc → pod.sub.ns.svc.<domain>
//
// Anything longer is taken to be a full name already.
func (d domains) kubeFQDNs(name, ns string) []string {
	switch countLabels(name) {
	case 1:
		return []string{name + "." + d.namespaced(ns)}
	case 2:
		return []string{name + "." + d.svc, name + "." + d.namespaced(ns)}
	case 3:
		if hasDomain(name, "svc") {
			return []string{name + "." + d.cluster, name + "." + d.svc}
		}
		return []string{name + "." + d.svc}
	case 4:
		if hasDomain(name, "svc") {
			return []string{name + "." + d.cluster}
		}
	}
	return nil
}

// aliases lists, without repeats, every name a request for name from a
// client in namespace ns may mean, most specific first: the name itself,
// its Kubernetes expansions, then for each search domain it ends with, the
// name without it and that name's expansions (upstream Store::get_aliases).
func (d domains) aliases(name, ns string, search []string) []alias {
	out := make([]alias, 0, 8)
	add := func(a alias) {
		for _, have := range out {
			if have.name == a.name {
				return
			}
		}
		out = append(out, a)
	}
	add(alias{name: name})
	for _, f := range d.kubeFQDNs(name, ns) {
		add(alias{name: f})
	}
	for _, sd := range search {
		stripped, ok := trimDomain(name, sd)
		if !ok {
			continue
		}
		add(alias{name: stripped, stripped: stripped})
		for _, f := range d.kubeFQDNs(stripped, ns) {
			add(alias{name: f, stripped: stripped})
		}
	}
	return out
}

// wildcards lists name, then the wildcards that could cover it, most
// specific first: a.b.c → a.b.c, *.b.c, *.c (upstream get_wildcards).
func wildcards(name string, yield func(string) bool) {
	if !yield(name) {
		return
	}
	for rest := name; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return
		}
		rest = rest[i+1:]
		if !yield("*." + rest) {
			return
		}
	}
}
