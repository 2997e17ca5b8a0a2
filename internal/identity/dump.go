package identity

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"slices"
	"strings"
	"time"
)

// CertsDump is one identity in the "certificates" section of /config_dump,
// in upstream's shape (what `istioctl ztunnel-config certificate` parses).
type CertsDump struct {
	Identity string `json:"identity"`
	// State is "Available", "Initializing" or "Unavailable: <error>".
	State string `json:"state"`
	// CertChain is the leaf, then intermediates; empty unless Available.
	CertChain []CertDump `json:"certChain"`
	RootCerts []CertDump `json:"rootCerts"`
}

// CertDump describes one certificate. It never carries private keys.
type CertDump struct {
	// PEM is the base64 encoding of the certificate's PEM text (upstream's
	// quirk, kept for istioctl).
	PEM string `json:"pem"`
	// SerialNumber is decimal; istioctl prints it in hex.
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`      // RFC 3339, seconds, UTC
	ExpirationTime string `json:"expirationTime"` // RFC 3339, seconds, UTC
}

// Dump states.
const (
	StateAvailable    = "Available"
	StateInitializing = "Initializing"
	StateUnavailable  = "Unavailable"
)

// Dump returns the certificates section of /config_dump, sorted by identity.
func (m *Manager) Dump() []CertsDump {
	now := time.Now()
	entries := m.snapshot()
	out := make([]CertsDump, 0, len(entries))
	for _, e := range entries {
		d := CertsDump{Identity: e.id.String(), CertChain: []CertDump{}, RootCerts: []CertDump{}}
		c := e.cur.Load()
		e.mu.Lock()
		ferr := e.err
		e.mu.Unlock()
		switch {
		case c != nil && now.Before(c.NotAfter):
			d.State = StateAvailable
			d.CertChain = dumpCerts(c.Chain)
			d.RootCerts = dumpCerts(c.Roots)
		case ferr != nil:
			d.State = StateUnavailable + ": " + ferr.Error()
		default:
			d.State = StateInitializing
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b CertsDump) int { return strings.Compare(a.Identity, b.Identity) })
	return out
}

func dumpCerts(certs []*x509.Certificate) []CertDump {
	out := make([]CertDump, 0, len(certs))
	for _, c := range certs {
		out = append(out, CertDump{
			PEM:            base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: c.Raw})),
			SerialNumber:   c.SerialNumber.String(),
			ValidFrom:      rfc3339(c.NotBefore),
			ExpirationTime: rfc3339(c.NotAfter),
		})
	}
	return out
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }
