package proxy

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// PoolTLS adapts the cert manager to hbone.PoolOptions.TLS: the client
// certificate of key.Src, and the peer verified against key.Dst (built by
// hbone.DstIdentities). The manager caches the configs per identity set.
func PoolTLS(m *identity.Manager) func(hbone.Key) (*tls.Config, error) {
	return func(key hbone.Key) (*tls.Config, error) {
		var accept []identity.Identity
		for _, s := range strings.Split(key.Dst, ",") {
			if s == "" {
				continue
			}
			id, err := identity.Parse(s)
			if err != nil {
				return nil, fmt.Errorf("proxy: hbone tls for %s: %w", key, err)
			}
			accept = append(accept, id)
		}
		return m.ClientConfig(key.Src, accept), nil
	}
}
