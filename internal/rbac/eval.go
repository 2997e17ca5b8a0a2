package rbac

import (
	"net/netip"
	"slices"
	"strings"
)

// tri is the compile-time outcome of one node of the rule tree. Compile
// folds constant nodes away, so evaluation only walks nodes that depend on
// the connection.
type tri uint8

const (
	evaluate    tri = iota // depends on the connection
	alwaysTrue             // holds for every connection
	alwaysFalse            // holds for none
)

// rule holds when every clause holds (clauses that always hold are dropped).
type rule struct{ clauses []clause }

// clause holds when any match holds (matches that never hold are dropped).
type clause struct{ alts []match }

// match holds when every non-empty field holds; a field holds when the
// attribute is in its positive list (if any) and in none of its not_ list.
type match struct {
	namespaces, notNamespaces []strMatch
	principals, notPrincipals []strMatch
	serviceAccounts           []saMatch
	notServiceAccounts        []saMatch
	srcIPs, notSrcIPs         []netip.Prefix
	dstIPs, notDstIPs         []netip.Prefix
	// Sorted and deduplicated so long lists can be binary searched.
	ports, notPorts []uint16
}

type strKind uint8

const (
	strExact strKind = iota
	strPrefix
	strSuffix
	strPresence
)

type strMatch struct {
	kind  strKind
	value string
}

func (m strMatch) matches(s string) bool {
	switch m.kind {
	case strExact:
		return s == m.value
	case strPrefix:
		return strings.HasPrefix(s, m.value)
	case strSuffix:
		return strings.HasSuffix(s, m.value)
	}
	return s != "" // presence
}

type saMatch struct{ namespace, serviceAccount string }

// attrs is a Conn digested once per Evaluate.
type attrs struct {
	src, dst netip.Addr
	port     uint16
	// hasID is false for plaintext and for an identity not of Istio's form.
	hasID bool
	// principal is the SPIFFE id without "spiffe://": Istio principals
	// ("cluster.local/ns/default/sa/x") are written without the scheme, and
	// upstream strips it before matching.
	principal string
	namespace string // "" without identity, as upstream
	account   string
}

const spiffePrefix = "spiffe://"

func newAttrs(c Conn) attrs {
	a := attrs{src: canonical(c.SrcIP), dst: canonical(c.DstIP), port: c.DstPort}
	if p, ns, sa, ok := parseIdentity(c.SrcIdentity); ok {
		a.hasID, a.principal, a.namespace, a.account = true, p, ns, sa
	}
	return a
}

// canonical unmaps IPv4-mapped IPv6 and drops the zone, which would make
// netip.Prefix.Contains fail; upstream's listeners hand rbac canonical
// addresses.
func canonical(ip netip.Addr) netip.Addr { return ip.Unmap().WithZone("") }

// parseIdentity splits spiffe://<td>/ns/<ns>/sa/<sa> without allocating,
// with upstream's rules: exactly five '/'-separated segments after the
// scheme, the second "ns" and the fourth "sa" (empty values allowed).
func parseIdentity(s string) (principal, namespace, account string, ok bool) {
	rest, ok := strings.CutPrefix(s, spiffePrefix)
	if !ok {
		return "", "", "", false
	}
	_, r, ok1 := strings.Cut(rest, "/")
	nsKey, r, ok2 := strings.Cut(r, "/")
	namespace, r, ok3 := strings.Cut(r, "/")
	saKey, account, ok4 := strings.Cut(r, "/")
	if !ok1 || !ok2 || !ok3 || !ok4 || nsKey != "ns" || saKey != "sa" || strings.IndexByte(account, '/') >= 0 {
		return "", "", "", false
	}
	return rest, namespace, account, true
}

func (p *Policy) matches(a *attrs) bool {
	switch p.fixed {
	case alwaysTrue:
		return true
	case alwaysFalse:
		return false
	}
	for i := range p.rules {
		if p.rules[i].matches(a) {
			return true
		}
	}
	return false
}

func (r *rule) matches(a *attrs) bool {
	for i := range r.clauses {
		if !r.clauses[i].matches(a) {
			return false
		}
	}
	return true
}

func (c *clause) matches(a *attrs) bool {
	for i := range c.alts {
		if c.alts[i].matches(a) {
			return true
		}
	}
	return false
}

func (m *match) matches(a *attrs) bool {
	return prefixField(m.dstIPs, m.notDstIPs, a.dst) &&
		prefixField(m.srcIPs, m.notSrcIPs, a.src) &&
		portField(m.ports, m.notPorts, a.port) &&
		saField(m.serviceAccounts, m.notServiceAccounts, a) &&
		principalField(m.principals, m.notPrincipals, a) &&
		strField(m.namespaces, m.notNamespaces, a.namespace)
}

// Each xxxField applies upstream's matches_internal: an empty positive list
// holds, a non-empty one needs any entry to match; an empty negative list
// holds, a non-empty one needs no entry to match.

func prefixField(pos, neg []netip.Prefix, ip netip.Addr) bool {
	return (len(pos) == 0 || anyPrefix(pos, ip)) && (len(neg) == 0 || !anyPrefix(neg, ip))
}

func anyPrefix(l []netip.Prefix, ip netip.Addr) bool {
	for _, p := range l {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func portField(pos, neg []uint16, port uint16) bool {
	return (len(pos) == 0 || hasPort(pos, port)) && (len(neg) == 0 || !hasPort(neg, port))
}

// linearPorts is the list length below which a scan beats binary search.
const linearPorts = 8

func hasPort(l []uint16, port uint16) bool {
	if len(l) > linearPorts {
		_, ok := slices.BinarySearch(l, port)
		return ok
	}
	for _, p := range l {
		if p == port {
			return true
		}
	}
	return false
}

func saField(pos, neg []saMatch, a *attrs) bool {
	return (len(pos) == 0 || anySA(pos, a)) && (len(neg) == 0 || !anySA(neg, a))
}

// anySA never matches without an identity, as upstream.
func anySA(l []saMatch, a *attrs) bool {
	if !a.hasID {
		return false
	}
	for _, m := range l {
		if m.namespace == a.namespace && m.serviceAccount == a.account {
			return true
		}
	}
	return false
}

func principalField(pos, neg []strMatch, a *attrs) bool {
	return (len(pos) == 0 || anyPrincipal(pos, a)) && (len(neg) == 0 || !anyPrincipal(neg, a))
}

// anyPrincipal never matches without an identity: upstream matches against
// the empty string, which lacks the "spiffe://" prefix it requires.
func anyPrincipal(l []strMatch, a *attrs) bool {
	if !a.hasID {
		return false
	}
	return anyStr(l, a.principal)
}

func strField(pos, neg []strMatch, s string) bool {
	return (len(pos) == 0 || anyStr(pos, s)) && (len(neg) == 0 || !anyStr(neg, s))
}

func anyStr(l []strMatch, s string) bool {
	for _, m := range l {
		if m.matches(s) {
			return true
		}
	}
	return false
}
