package identity

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Identity is a workload identity in Istio's SPIFFE form,
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>.
// The zero value means "no identity" (plaintext peer).
type Identity struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// New returns the identity for a service account; an empty trust domain
// means the Istio default, cluster.local.
func New(trustDomain, namespace, serviceAccount string) Identity {
	if trustDomain == "" {
		trustDomain = DefaultTrustDomain
	}
	return Identity{TrustDomain: trustDomain, Namespace: namespace, ServiceAccount: serviceAccount}
}

// DefaultTrustDomain is Istio's trust domain when none is configured.
const DefaultTrustDomain = "cluster.local"

// IsZero reports whether id is the "no identity" value.
func (id Identity) IsZero() bool { return id == Identity{} }

// String returns the SPIFFE URI, or "" for the zero Identity.
func (id Identity) String() string {
	if id.IsZero() {
		return ""
	}
	return "spiffe://" + id.TrustDomain + "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount
}

// Parse reads a SPIFFE URI of the Istio form. Other SPIFFE paths are
// rejected: Istio authorization can only reason about ns/sa identities.
func Parse(s string) (Identity, error) {
	sid, err := spiffeid.FromString(s)
	if err != nil {
		return Identity{}, fmt.Errorf("identity: parse %q: %w", s, err)
	}
	parts := strings.Split(strings.TrimPrefix(sid.Path(), "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return Identity{}, fmt.Errorf("identity: parse %q: path must be /ns/<namespace>/sa/<service account>", s)
	}
	return Identity{TrustDomain: sid.TrustDomain().Name(), Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// URL returns the SPIFFE URI as a *url.URL, the form x509 SANs take.
func (id Identity) URL() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: id.TrustDomain, Path: "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount}
}

// identitiesOf returns every Istio SPIFFE id among c's URI SANs, in
// certificate order. Other URI SANs are ignored.
func identitiesOf(c *x509.Certificate) []Identity {
	var ids []Identity
	for _, u := range c.URIs {
		if u == nil || u.Scheme != "spiffe" {
			continue
		}
		if id, err := Parse(u.String()); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// FromCertificate returns the first Istio SPIFFE id in c's URI SANs.
func FromCertificate(c *x509.Certificate) (Identity, error) {
	if c == nil {
		return Identity{}, fmt.Errorf("identity: certificate: %w", ErrNoSPIFFEID)
	}
	ids := identitiesOf(c)
	if len(ids) == 0 {
		return Identity{}, fmt.Errorf("identity: certificate %s: %w", serialHex(c), ErrNoSPIFFEID)
	}
	return ids[0], nil
}

func serialHex(c *x509.Certificate) string {
	if c.SerialNumber == nil {
		return "serial <none>"
	}
	return "serial " + c.SerialNumber.Text(16)
}
