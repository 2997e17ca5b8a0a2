package hbone

import (
	"context"
	"net/netip"
	"slices"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// Key selects the pooled HBONE connections a stream may use. Streams share
// a connection only if they agree on every field: who we present as, whom
// we accept on the other end, and where we connect. Key is comparable.
type Key struct {
	// Src is the identity whose certificate the connection presents.
	Src identity.Identity
	// Dst is the canonical set of identities the peer may present, as
	// built by DstIdentities. PoolOptions.TLS must verify against it.
	Dst string
	// Addr is the TCP destination: the peer's HBONE port (15008) or a
	// waypoint/gateway.
	Addr netip.AddrPort
	// SrcAddr is the local address to connect from, for source-IP
	// spoofing; zero lets the kernel choose. Upstream keys on it because
	// connections from different spoofed sources cannot be shared. The
	// pool does not bind it: PoolOptions.Dial reads it via KeyFromContext.
	SrcAddr netip.Addr
}

// String renders the key for logs: src(id)->addr[ids].
func (k Key) String() string {
	var sb strings.Builder
	if k.SrcAddr.IsValid() {
		sb.WriteString(k.SrcAddr.String())
	}
	sb.WriteByte('(')
	sb.WriteString(k.Src.String())
	sb.WriteString(")->")
	sb.WriteString(k.Addr.String())
	sb.WriteByte('[')
	sb.WriteString(k.Dst)
	sb.WriteByte(']')
	return sb.String()
}

// DstIdentities returns the canonical form of an accepted-identity set for
// Key.Dst: SPIFFE URIs sorted, duplicates and zero identities dropped,
// joined by commas. The same set in any order gives the same string.
func DstIdentities(ids ...identity.Identity) string {
	s := make([]string, 0, len(ids))
	for _, id := range ids {
		if !id.IsZero() {
			s = append(s, id.String())
		}
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), ",")
}

type keyContextKey struct{}

// KeyFromContext returns the Key a PoolOptions.Dial call is dialing for,
// so a dialer can bind Key.SrcAddr or pick a network namespace.
func KeyFromContext(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyContextKey{}).(Key)
	return k, ok
}
