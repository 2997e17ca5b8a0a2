package caclient

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// RootSystem is the CA_ROOT_CA value selecting the system trust store.
const RootSystem = "SYSTEM"

// rootSource yields the roots the CA's certificate must chain to. A file
// source is re-read when its size or modification time changes, so a
// rotated root (a Kubernetes ConfigMap update) applies to the next
// connection; if the new content does not parse, the old roots stay.
type rootSource struct {
	// immutable after construction
	file string // "" for a fixed pool
	log  *slog.Logger

	mu      sync.Mutex
	pool    *x509.CertPool // guarded by mu
	modTime time.Time      // guarded by mu
	size    int64          // guarded by mu
}

// newRootSource interprets a CA_ROOT_CA value as upstream does: an existing
// file, then "SYSTEM", then inline PEM.
func newRootSource(v string, log *slog.Logger) (*rootSource, error) {
	if v == "" {
		return nil, errors.New("caclient: root CA: empty (want a PEM file path, SYSTEM or PEM)")
	}
	if fi, err := os.Stat(v); err == nil && !fi.IsDir() {
		r := &rootSource{file: v, log: log}
		if _, err := r.get(); err != nil {
			return nil, fmt.Errorf("caclient: root CA: %w", err)
		}
		return r, nil
	}
	if v == RootSystem {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("caclient: root CA: system roots: %w", err)
		}
		return &rootSource{pool: pool, log: log}, nil
	}
	certs, err := identity.ParseCertificatesPEM([]byte(v))
	if err != nil {
		return nil, fmt.Errorf("caclient: root CA %.40q: not an existing file, %s, or PEM certificates: %w", v, RootSystem, err)
	}
	return &rootSource{pool: poolOf(certs), log: log}, nil
}

func (r *rootSource) get() (*x509.CertPool, error) {
	if r.file == "" {
		return r.pool, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fi, err := os.Stat(r.file)
	if err != nil {
		if r.pool != nil {
			r.log.Warn("caclient: root CA file unreadable; keeping the previous roots", "file", r.file, "error", err)
			return r.pool, nil
		}
		return nil, err
	}
	if r.pool != nil && fi.ModTime().Equal(r.modTime) && fi.Size() == r.size {
		return r.pool, nil
	}
	data, err := os.ReadFile(r.file)
	if err == nil {
		var certs []*x509.Certificate
		if certs, err = identity.ParseCertificatesPEM(data); err == nil {
			r.pool, r.modTime, r.size = poolOf(certs), fi.ModTime(), fi.Size()
			return r.pool, nil
		}
	}
	err = fmt.Errorf("%s: %w", r.file, err)
	if r.pool != nil {
		r.log.Warn("caclient: root CA file changed but does not load; keeping the previous roots", "error", err)
		return r.pool, nil
	}
	return nil, err
}

func poolOf(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
