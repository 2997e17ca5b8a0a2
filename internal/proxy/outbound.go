package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"golang.org/x/sys/unix"
)

// Rejection reasons (counter labels and error text).
const (
	reasonNoOriginalDst = "no_original_dst"
	reasonLoop          = "loop"
	reasonNoEndpoint    = "no_healthy_endpoint"
	reasonNoWaypoint    = "waypoint_unresolved"
	reasonDialFailed    = "dial_failed"
	reasonNotLocal      = "destination_not_local"
	reasonDenied        = "denied"
	reasonBadAuthority  = "bad_authority"
)

// routeKind is how an outbound connection leaves.
type routeKind uint8

const (
	routePassthrough routeKind = iota // plain TCP to the original destination
	routeTCP                          // plain TCP to a chosen (non-HBONE) endpoint
	routeHBONE                        // tunnel to a workload's ztunnel or a waypoint
)

// route is the outcome of resolving an outbound destination.
type route struct {
	kind routeKind
	// target is where TCP goes: the endpoint (routeTCP/routePassthrough)
	// or the tunnel's far end, ip:15008 (routeHBONE).
	target netip.AddrPort
	// authority is the CONNECT :authority (routeHBONE).
	authority netip.AddrPort
	// accept are the identities the tunnel's peer may present.
	accept []identity.Identity
	// dst and svc describe the destination for metrics and logs.
	dst *state.Workload
	svc *state.Service
	// early: the tunnel's peer is the destination workload's ztunnel,
	// which takes the connection's first bytes with the CONNECT (see
	// readReady). Not a waypoint: Envoy accepts such early CONNECT data
	// by default but can be set to reject it
	// (envoy.reloadable_features.reject_early_connect_data, after
	// CVE-2025-64763), and the CONNECT must not fail for that.
	early bool
}

type routeError struct {
	reason string
	msg    string
}

func (e *routeError) Error() string { return "proxy: outbound: " + e.msg }

// resolve decides where a connection from src to dst goes, as upstream:
// service waypoint, then endpoint selection, then workload waypoint, then
// HBONE or TCP by the destination's protocol; unknown destinations pass
// through.
func (p *Proxy) resolve(snap *state.Snapshot, src *state.Workload, dst netip.AddrPort) (route, error) {
	network := p.opts.Network
	srcNS := p.opts.Local.Namespace
	svc := snap.ServiceByVIP(network, dst.Addr(), srcNS)
	if svc != nil {
		if gw := svc.PickWaypoint(nil); gw != nil && !p.isWaypoint(snap, gw) {
			return p.viaWaypoint(snap, src, gw, dst, svc, nil)
		}
	}
	up, ok := snap.FindUpstream(src, network, dst, state.ResolveStandard, nil)
	if !ok {
		if svc != nil {
			return route{}, &routeError{reasonNoEndpoint, fmt.Sprintf("service %s has no healthy endpoint for port %d", svc.Key(), dst.Port())}
		}
		return route{kind: routePassthrough, target: dst}, nil
	}
	if up.Passthrough {
		return route{kind: routePassthrough, target: dst, svc: up.Service}, nil
	}
	w := up.Workload
	if svc == nil && w.Waypoint != nil && !p.isWaypoint(snap, w.Waypoint) {
		return p.viaWaypoint(snap, src, w.Waypoint, dst, nil, w)
	}
	ip, ok := w.PickIP(dst.Addr(), state.IPFamilies(0))
	if !ok {
		return route{}, &routeError{reasonNoEndpoint, fmt.Sprintf("workload %s has no usable address", w.UID)}
	}
	target := netip.AddrPortFrom(ip, up.Port)
	if w.Protocol != state.ProtocolHBONE {
		return route{kind: routeTCP, target: target, dst: w, svc: up.Service}, nil
	}
	accept := []identity.Identity{workloadIdentity(w)}
	if up.Service != nil {
		accept = appendSANs(accept, up.Service.SubjectAltNames)
	}
	return route{
		kind:      routeHBONE,
		target:    netip.AddrPortFrom(ip, HBONEPort),
		authority: target,
		accept:    accept,
		dst:       w,
		svc:       up.Service,
		early:     true,
	}, nil
}

// viaWaypoint tunnels to the waypoint gw with the original destination as
// :authority; the waypoint applies L7 policy and picks the endpoint.
func (p *Proxy) viaWaypoint(snap *state.Snapshot, src *state.Workload, gw *state.GatewayAddress, dst netip.AddrPort, svc *state.Service, w *state.Workload) (route, error) {
	up, ok := snap.ResolveGateway(src, gw, state.ResolveWaypoint, nil)
	if !ok || up.Workload == nil {
		return route{}, &routeError{reasonNoWaypoint, fmt.Sprintf("waypoint %s for %s is not known or has no endpoint", gw.Destination(), dst)}
	}
	ip, ok := up.Workload.PickIP(dst.Addr(), state.IPFamilies(0))
	if !ok {
		return route{}, &routeError{reasonNoWaypoint, fmt.Sprintf("waypoint %s has no usable address", up.Workload.UID)}
	}
	port := gw.HBONEPort
	if port == 0 {
		port = HBONEPort
	}
	accept := []identity.Identity{workloadIdentity(up.Workload)}
	if up.Service != nil {
		accept = appendSANs(accept, up.Service.SubjectAltNames)
	}
	return route{
		kind:      routeHBONE,
		target:    netip.AddrPortFrom(ip, port),
		authority: dst,
		accept:    accept,
		dst:       w,
		svc:       svc,
	}, nil
}

// isWaypoint reports whether this proxy's workload is the waypoint gw, so a
// waypoint's own outbound traffic is not sent back to itself.
func (p *Proxy) isWaypoint(snap *state.Snapshot, gw *state.GatewayAddress) bool {
	if gw.Address != nil {
		w := snap.WorkloadByAddr(gw.Address.Network, gw.Address.Addr)
		return p.isLocal(w)
	}
	if gw.Hostname != nil {
		if svc := snap.FindHostname(*gw.Hostname).Service; svc != nil {
			for _, ep := range snap.Endpoints(svc) {
				if p.isLocal(ep.Workload) {
					return true
				}
			}
		}
	}
	return false
}

func workloadIdentity(w *state.Workload) identity.Identity {
	return identity.New(w.TrustDomain, w.Namespace, w.ServiceAccount)
}

func appendSANs(ids []identity.Identity, sans []string) []identity.Identity {
	for _, s := range sans {
		if id, err := identity.Parse(s); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

func (p *Proxy) handleOutbound(conn *net.TCPConn) {
	src := addrPort(conn.RemoteAddr())
	dst, err := sockopt.OriginalDst(conn)
	if err != nil {
		// Not redirected: the client dialled 15001 itself. Nothing to do.
		p.m.rejected.WithLabelValues("outbound", reasonNoOriginalDst).Inc()
		p.log.Debug("outbound connection without original destination", "src", src.String(), "err", err)
		conn.Close()
		return
	}
	rec := newRecord(p.m, p.log, "outbound", src, dst)
	up, err := p.dialOutbound(rec, conn, src, dst)
	if err != nil {
		rec.done(&err)
		conn.Close()
		return
	}
	rec.open(rec.labels)
	untrack := p.conns.add(&tracked{rec: rec, close: func() { abort(conn, up) }})
	p.relay(conn, up, &rec.counts, func(err error) {
		untrack()
		up.Close()
		rec.done(&err)
		conn.Close()
	})
}

// dialOutbound routes an outbound connection and connects its upstream
// (an HBONE stream or a plain TCP connection). On error nothing is left
// open. The connect's timeout derives from the proxy's context, not from
// one made per connection: a per-connection context would keep the
// children map and Done channel the derivation allocates in it (~370 B)
// for the connection's whole life, and nothing else uses it once the
// upstream is connected (an HBONE stream outlives its CONNECT's context).
func (p *Proxy) dialOutbound(rec *record, down *net.TCPConn, src, dst netip.AddrPort) (up net.Conn, err error) {
	snap := p.opts.State()
	if p.isOwnListener(snap, dst) {
		p.m.rejected.WithLabelValues("outbound", reasonLoop).Inc()
		return nil, &routeError{reasonLoop, fmt.Sprintf("destination %s is ztunnel's own listener", dst)}
	}
	srcW := snap.WorkloadByAddr(p.opts.Network, src.Addr())
	if srcW != nil && !p.isLocal(srcW) {
		srcW = nil // not our workload's address: label it unknown
	}
	r, err := p.resolve(snap, srcW, dst)
	rec.labels = p.outboundLabels(srcW, r)
	if err != nil {
		var re *routeError
		if errors.As(err, &re) {
			p.m.rejected.WithLabelValues("outbound", re.reason).Inc()
		}
		return nil, err
	}
	switch r.kind {
	case routeHBONE:
		rec.hbone = r.target.String()
		var early []byte
		if r.early {
			bp := smallPool.Get().(*[]byte)
			defer smallPool.Put(bp)
			n, rerr := readReady(down, *bp)
			if rerr != nil {
				// The client is gone (reset): nothing to connect for,
				// and not a failure to connect.
				return nil, fmt.Errorf("proxy: outbound: reading the client: %w", rerr)
			}
			early = (*bp)[:n]
		}
		if up, err = p.connectHBONE(r, src, srcW, early); err == nil {
			rec.counts.received.Add(int64(len(early)))
		}
	default:
		dctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
		up, err = p.opts.Dial(dctx, "tcp", r.target.String())
		cancel()
	}
	if err != nil {
		rec.labels.ResponseFlags = flagConnect
		p.m.rejected.WithLabelValues("outbound", reasonDialFailed).Inc()
		return nil, err
	}
	return up, nil
}

// connectHBONE opens the tunnel for r. early are the connection's first
// bytes, sent with the CONNECT (hbone.ConnectHeader.Early).
func (p *Proxy) connectHBONE(r route, src netip.AddrPort, srcW *state.Workload, early []byte) (net.Conn, error) {
	key := hbone.Key{Src: p.self, Dst: hbone.DstIdentities(r.accept...), Addr: r.target}
	host := ""
	if r.svc != nil {
		host = r.svc.Hostname
	}
	hdr := hbone.ConnectHeader{
		Forwarded:   hbone.FormatForwarded(src, host),
		Traceparent: hbone.NewTraceParent().String(),
		Early:       early,
	}
	if b, ok := p.baggage(srcW); ok {
		hdr.Baggage = b
	}
	dctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
	defer cancel()
	s, err := p.opts.Pool.Connect(dctx, key, r.authority.String(), &hdr)
	if err != nil {
		return nil, fmt.Errorf("proxy: hbone to %s via %s: %w", r.authority, r.target, err)
	}
	return s, nil
}

// readReady reads what c already holds, without waiting: a client that
// speaks first (HTTP, a TLS ClientHello) has usually sent its first
// bytes by the time the tunnel is opened, and sent with the CONNECT they
// reach the destination a round trip between the nodes sooner (and the
// sending ztunnel saves a write, the receiving one a read and a wake-up).
// Nothing there (a server-first protocol, or a slow client) costs one
// read that finds nothing. The error is the socket's, EOF aside: after
// EOF a read finds EOF again, so the copy that follows sees it too.
func readReady(c *net.TCPConn, buf []byte) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), buf)
			if rerr != unix.EINTR {
				break
			}
		}
		return true // one try: never wait for the client
	})
	switch {
	case err != nil:
		return 0, err
	case rerr == unix.EAGAIN:
		return 0, nil
	case rerr != nil:
		return 0, os.NewSyscallError("read", rerr)
	}
	return n, nil
}

// baggage describes the source workload to the peer, as upstream sends it.
func (p *Proxy) baggage(w *state.Workload) (string, bool) {
	if w == nil {
		return "", false
	}
	return hbone.FormatBaggage(hbone.Baggage{
		ClusterID:    w.ClusterID,
		Namespace:    w.Namespace,
		WorkloadName: w.WorkloadName,
		ServiceName:  w.CanonicalName,
		Revision:     w.CanonicalRevision,
	}, w.WorkloadType), true
}

// isOwnListener catches a redirect loop: a connection whose original
// destination is one of ztunnel's ports on the served workload itself.
func (p *Proxy) isOwnListener(snap *state.Snapshot, dst netip.AddrPort) bool {
	switch dst.Port() {
	case OutboundPort, InboundPlaintextPort:
	default:
		return false
	}
	return dst.Addr().IsLoopback() || p.isLocal(snap.WorkloadByAddr(p.opts.Network, dst.Addr()))
}
