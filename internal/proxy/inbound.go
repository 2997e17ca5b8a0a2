package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
	"github.com/ztunnel-go/ztunnel/internal/state"
)

// handleHBONE serves one CONNECT stream on 15008.
func (p *Proxy) handleHBONE(_ context.Context, req *hbone.Request) {
	defer p.conns.begin()()
	rec := newRecord(p.m, p.log, "inbound", req.RemoteAddr, req.Authority)
	rec.hbone = req.LocalAddr.String()
	up, check, err := p.admitHBONE(req, rec)
	if err != nil {
		rec.done(&err)
		return
	}
	stream, err := req.Accept(nil)
	if err != nil {
		up.Close()
		rec.done(&err)
		return
	}
	rec.open(rec.labels)
	untrack := p.track(&tracked{rec: rec, close: func() { abort(stream, up) }, policy: check})
	finish := req.Detach()
	p.relay(stream, up, &rec.counts, func(err error) {
		untrack()
		stream.Close()
		up.Close()
		rec.done(&err)
		finish()
	})
}

// admitHBONE labels rec from the stream's workloads and peer certificate,
// checks that the destination is served here and that policy allows the
// connection, and connects the destination. On error it has answered the
// CONNECT (400, 401 or 503) and left nothing open. check re-evaluates
// the policy for the live connection.
func (p *Proxy) admitHBONE(req *hbone.Request, rec *record) (up net.Conn, check *policyCheck, err error) {
	src, dst := req.RemoteAddr, req.Authority
	peer := identity.Identity{}
	if req.TLS != nil {
		if id, err := identity.PeerIdentity(*req.TLS); err == nil {
			peer = id
		}
	}
	snap := p.opts.State()
	dstW := snap.WorkloadByAddr(p.opts.Network, dst.Addr())
	srcW := snap.WorkloadByAddr(p.opts.Network, src.Addr())
	peerID := peer.String() // once: labels and policy both need it
	rec.labels = p.inboundLabels(srcW, dstW, peer, peerID, policyMutualTLS)
	if !p.isLocal(dstW) {
		p.m.rejected.WithLabelValues("inbound", reasonNotLocal).Inc()
		req.Reject(http.StatusBadRequest, "destination is not served by this ztunnel")
		return nil, nil, fmt.Errorf("proxy: inbound: %s is not a workload served here (%s/%s)", dst, p.opts.Local.Namespace, p.opts.Local.Name)
	}
	conn := rbac.Conn{SrcIP: src.Addr(), DstIP: dst.Addr(), DstPort: dst.Port(), SrcIdentity: peerID}
	if d := authorize(snap, dstW, conn); !d.Allowed {
		rec.labels.ResponseFlags = flagDeny
		p.m.denied.WithLabelValues("inbound", d.Policy).Inc()
		req.Reject(http.StatusUnauthorized, "denied by authorization policy")
		return nil, nil, fmt.Errorf("proxy: inbound: connection from %s (%s) to %s denied: %s", src, peer, dst, d)
	}
	// From the proxy's context, not the request's, for the reason given
	// at dialOutbound: the request's context lives as long as the stream.
	dctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
	up, err = p.dialInbound(dctx, dst, src.Addr())
	cancel()
	if err != nil {
		rec.labels.ResponseFlags = flagConnect
		p.m.rejected.WithLabelValues("inbound", reasonDialFailed).Inc()
		req.Reject(http.StatusServiceUnavailable, "upstream connect failed")
		return nil, nil, fmt.Errorf("proxy: inbound: dial %s: %w", dst, err)
	}
	return up, &policyCheck{admitted: snap, dstUID: dstW.UID, conn: conn}, nil
}

// handlePlaintext serves a redirected plaintext inbound connection (15006).
func (p *Proxy) handlePlaintext(conn *net.TCPConn) {
	src := addrPort(conn.RemoteAddr())
	dst, err := sockopt.OriginalDst(conn)
	if err != nil {
		dst = addrPort(conn.LocalAddr())
	}
	rec := newRecord(p.m, p.log, "inbound", src, dst)
	up, check, err := p.admitPlaintext(rec, src, dst)
	if err != nil {
		rec.done(&err)
		conn.Close()
		return
	}
	rec.open(rec.labels)
	untrack := p.track(&tracked{rec: rec, close: func() { abort(conn, up) }, policy: check})
	p.relay(conn, up, &rec.counts, func(err error) {
		untrack()
		up.Close()
		rec.done(&err)
		conn.Close()
	})
}

// admitPlaintext is admitHBONE for a plaintext connection from src to dst:
// no peer identity, and nothing to answer on error (the caller closes).
func (p *Proxy) admitPlaintext(rec *record, src, dst netip.AddrPort) (up net.Conn, check *policyCheck, err error) {
	snap := p.opts.State()
	dstW := snap.WorkloadByAddr(p.opts.Network, dst.Addr())
	srcW := snap.WorkloadByAddr(p.opts.Network, src.Addr())
	rec.labels = p.inboundLabels(srcW, dstW, identity.Identity{}, "", policyUnknown)
	if dst.Port() == HBONEPort || dst.Port() == InboundPlaintextPort || dst.Port() == OutboundPort {
		p.m.rejected.WithLabelValues("inbound", reasonLoop).Inc()
		return nil, nil, &routeError{reasonLoop, fmt.Sprintf("plaintext connection to ztunnel port %s", dst)}
	}
	if !p.isLocal(dstW) {
		p.m.rejected.WithLabelValues("inbound", reasonNotLocal).Inc()
		return nil, nil, fmt.Errorf("proxy: inbound plaintext: %s is not a workload served here", dst)
	}
	c := rbac.Conn{SrcIP: src.Addr(), DstIP: dst.Addr(), DstPort: dst.Port()}
	if d := authorize(snap, dstW, c); !d.Allowed {
		rec.labels.ResponseFlags = flagDeny
		p.m.denied.WithLabelValues("inbound", d.Policy).Inc()
		return nil, nil, fmt.Errorf("proxy: inbound plaintext: connection from %s to %s denied: %s", src, dst, d)
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
	up, err = p.dialInbound(ctx, dst, src.Addr())
	cancel()
	if err != nil {
		rec.labels.ResponseFlags = flagConnect
		p.m.rejected.WithLabelValues("inbound", reasonDialFailed).Inc()
		return nil, nil, fmt.Errorf("proxy: inbound plaintext: dial %s: %w", dst, err)
	}
	return up, &policyCheck{admitted: snap, dstUID: dstW.UID, conn: c}, nil
}

// policyCheck re-evaluates the policy of a live inbound connection, for
// the same destination workload, against a newer snapshot.
type policyCheck struct {
	admitted *state.Snapshot // the snapshot the connection was admitted by
	dstUID   string
	conn     rbac.Conn
}

func (c *policyCheck) allowed(snap *state.Snapshot) bool {
	w := snap.WorkloadByUID(c.dstUID)
	if w == nil {
		return false // the workload is gone
	}
	return authorize(snap, w, c.conn).Allowed
}

// track adds c to the live connections. A policy change published
// between admission and now was re-evaluated without c, so c is checked
// here against the newest snapshot; otherwise a DENY pushed during the
// upstream dial would leave the connection open.
func (p *Proxy) track(c *tracked) (untrack func()) {
	untrack = p.conns.add(c)
	if c.policy == nil {
		return untrack
	}
	if snap := p.opts.State(); snap != c.policy.admitted && !c.policy.allowed(snap) {
		p.log.Info("closed a connection no longer allowed by policy", "src", c.policy.conn.SrcIP.String(), "dst", c.policy.dstUID)
		c.close()
	}
	return untrack
}

// labels.

func (p *Proxy) outboundLabels(src *state.Workload, r route) TrafficLabels {
	l := TrafficLabels{Reporter: reporterSource, RequestProtocol: "tcp", ResponseFlags: flagNone, SecurityPolicy: policyUnknown}
	if r.kind == routeHBONE {
		l.SecurityPolicy = policyMutualTLS
	}
	p.sourceLabels(&l, src, p.selfID)
	destinationLabels(&l, r.dst, r.svc)
	if r.dst != nil && r.kind == routeHBONE {
		l.DestinationPrincipal = workloadIdentity(r.dst).String()
	}
	return l
}

// inboundLabels: peerID is peer.String(), which the caller also needs.
func (p *Proxy) inboundLabels(src, dst *state.Workload, peer identity.Identity, peerID, policy string) TrafficLabels {
	l := TrafficLabels{Reporter: reporterDestination, RequestProtocol: "tcp", ResponseFlags: flagNone, SecurityPolicy: policy}
	if src != nil && !peer.IsZero() && workloadIdentity(src) != peer {
		src = nil // the address is not the peer's: trust the certificate only
	}
	if !peer.IsZero() {
		l.SourcePrincipal = peerID
		l.SourceNamespace = peer.Namespace
	}
	if src != nil {
		p.sourceLabels(&l, src, l.SourcePrincipal)
	}
	destinationLabels(&l, dst, nil)
	if dst != nil {
		l.DestinationPrincipal = p.selfID
	}
	return l
}

// sourceLabels sets the source labels from w and principal (a SPIFFE
// URI, "" for none), taken as a string so that callers format an identity
// once per connection.
func (p *Proxy) sourceLabels(l *TrafficLabels, w *state.Workload, principal string) {
	if principal != "" {
		l.SourcePrincipal = principal
	}
	if w == nil {
		return
	}
	l.SourceWorkload = w.WorkloadName
	l.SourceCanonicalService = w.CanonicalName
	l.SourceCanonicalRevision = w.CanonicalRevision
	l.SourceNamespace = w.Namespace
	l.SourceApp = w.CanonicalName
	l.SourceVersion = w.CanonicalRevision
	l.SourceCluster = w.ClusterID
}

func destinationLabels(l *TrafficLabels, w *state.Workload, svc *state.Service) {
	if svc != nil {
		l.DestinationService = svc.Hostname
		l.DestinationServiceNamespace = svc.Namespace
		l.DestinationServiceName = svc.Name
	}
	if w == nil {
		return
	}
	l.DestinationWorkload = w.WorkloadName
	l.DestinationCanonicalService = w.CanonicalName
	l.DestinationCanonicalRevision = w.CanonicalRevision
	l.DestinationNamespace = w.Namespace
	l.DestinationApp = w.CanonicalName
	l.DestinationVersion = w.CanonicalRevision
	l.DestinationCluster = w.ClusterID
}
