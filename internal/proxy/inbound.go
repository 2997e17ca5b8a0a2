package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/rbac"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
	"github.com/ztunnel-go/ztunnel/internal/state"
)

// handleHBONE serves one CONNECT stream on 15008.
func (p *Proxy) handleHBONE(ctx context.Context, req *hbone.Request) {
	defer p.conns.begin()()
	src := req.RemoteAddr
	dst := req.Authority
	rec := newRecord(p.m, p.log, "inbound", src, dst)
	rec.hbone = req.LocalAddr.String()
	var perr error
	relayed := false // then the relay's cleanup records the connection
	defer func() {
		if !relayed {
			rec.done(&perr)
		}
	}()

	peer := identity.Identity{}
	if req.TLS != nil {
		if id, err := identity.PeerIdentity(*req.TLS); err == nil {
			peer = id
		}
	}
	snap := p.opts.State()
	dstW := snap.WorkloadByAddr(p.opts.Network, dst.Addr())
	srcW := snap.WorkloadByAddr(p.opts.Network, src.Addr())
	rec.labels = p.inboundLabels(srcW, dstW, peer, policyMutualTLS)
	if !p.isLocal(dstW) {
		perr = fmt.Errorf("proxy: inbound: %s is not a workload served here (%s/%s)", dst, p.opts.Local.Namespace, p.opts.Local.Name)
		p.m.rejected.WithLabelValues("inbound", reasonNotLocal).Inc()
		req.Reject(http.StatusBadRequest, "destination is not served by this ztunnel")
		return
	}
	conn := rbac.Conn{SrcIP: src.Addr(), DstIP: dst.Addr(), DstPort: dst.Port(), SrcIdentity: peer.String()}
	if d := authorize(snap, dstW, conn); !d.Allowed {
		perr = fmt.Errorf("proxy: inbound: connection from %s (%s) to %s denied: %s", src, peer, dst, d)
		rec.labels.ResponseFlags = flagDeny
		p.m.denied.WithLabelValues("inbound", d.Policy).Inc()
		req.Reject(http.StatusUnauthorized, "denied by authorization policy")
		return
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	up, err := p.dialInbound(dctx, dst, src.Addr())
	cancel()
	if err != nil {
		perr = fmt.Errorf("proxy: inbound: dial %s: %w", dst, err)
		rec.labels.ResponseFlags = flagConnect
		p.m.rejected.WithLabelValues("inbound", reasonDialFailed).Inc()
		req.Reject(http.StatusServiceUnavailable, "upstream connect failed")
		return
	}
	stream, err := req.Accept(nil)
	if err != nil {
		up.Close()
		perr = err
		return
	}
	rec.open(rec.labels)
	untrack := p.conns.add(&tracked{
		rec:     rec,
		close:   func() { abort(stream, up) },
		recheck: p.recheck(dstW.UID, conn),
	})
	finish := req.Detach()
	relayed = true
	p.relay(stream, up, &rec.counts, func(err error) {
		untrack()
		stream.Close()
		up.Close()
		rec.done(&err)
		finish()
	})
}

// handlePlaintext serves a redirected plaintext inbound connection (15006).
func (p *Proxy) handlePlaintext(conn *net.TCPConn) {
	src := addrPort(conn.RemoteAddr())
	dst, err := sockopt.OriginalDst(conn)
	if err != nil {
		dst = addrPort(conn.LocalAddr())
	}
	rec := newRecord(p.m, p.log, "inbound", src, dst)
	var perr error
	relayed := false // then the relay's cleanup records and closes
	defer func() {
		if !relayed {
			rec.done(&perr)
			conn.Close()
		}
	}()

	snap := p.opts.State()
	dstW := snap.WorkloadByAddr(p.opts.Network, dst.Addr())
	srcW := snap.WorkloadByAddr(p.opts.Network, src.Addr())
	rec.labels = p.inboundLabels(srcW, dstW, identity.Identity{}, policyUnknown)
	if dst.Port() == HBONEPort || dst.Port() == InboundPlaintextPort || dst.Port() == OutboundPort {
		perr = &routeError{reasonLoop, fmt.Sprintf("plaintext connection to ztunnel port %s", dst)}
		p.m.rejected.WithLabelValues("inbound", reasonLoop).Inc()
		return
	}
	if !p.isLocal(dstW) {
		perr = fmt.Errorf("proxy: inbound plaintext: %s is not a workload served here", dst)
		p.m.rejected.WithLabelValues("inbound", reasonNotLocal).Inc()
		return
	}
	c := rbac.Conn{SrcIP: src.Addr(), DstIP: dst.Addr(), DstPort: dst.Port()}
	if d := authorize(snap, dstW, c); !d.Allowed {
		perr = fmt.Errorf("proxy: inbound plaintext: connection from %s to %s denied: %s", src, dst, d)
		rec.labels.ResponseFlags = flagDeny
		p.m.denied.WithLabelValues("inbound", d.Policy).Inc()
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
	up, err := p.dialInbound(ctx, dst, src.Addr())
	cancel()
	if err != nil {
		perr = fmt.Errorf("proxy: inbound plaintext: dial %s: %w", dst, err)
		rec.labels.ResponseFlags = flagConnect
		p.m.rejected.WithLabelValues("inbound", reasonDialFailed).Inc()
		return
	}
	rec.open(rec.labels)
	untrack := p.conns.add(&tracked{rec: rec, close: func() { abort(conn, up) }, recheck: p.recheck(dstW.UID, c)})
	relayed = true
	p.relay(conn, up, &rec.counts, func(err error) {
		untrack()
		up.Close()
		rec.done(&err)
		conn.Close()
	})
}

// recheck returns the policy re-evaluation for a live inbound connection:
// against the newest snapshot, for the same destination workload.
func (p *Proxy) recheck(dstUID string, c rbac.Conn) func() bool {
	return func() bool {
		snap := p.opts.State()
		w := snap.WorkloadByUID(dstUID)
		if w == nil {
			return false // the workload is gone
		}
		return authorize(snap, w, c).Allowed
	}
}

// labels.

func (p *Proxy) outboundLabels(src *state.Workload, r route) TrafficLabels {
	l := TrafficLabels{Reporter: reporterSource, RequestProtocol: "tcp", ResponseFlags: flagNone, SecurityPolicy: policyUnknown}
	if r.kind == routeHBONE {
		l.SecurityPolicy = policyMutualTLS
	}
	p.sourceLabels(&l, src, p.self)
	destinationLabels(&l, r.dst, r.svc)
	if r.dst != nil && r.kind == routeHBONE {
		l.DestinationPrincipal = workloadIdentity(r.dst).String()
	}
	return l
}

func (p *Proxy) inboundLabels(src, dst *state.Workload, peer identity.Identity, policy string) TrafficLabels {
	l := TrafficLabels{Reporter: reporterDestination, RequestProtocol: "tcp", ResponseFlags: flagNone, SecurityPolicy: policy}
	if src != nil && !peer.IsZero() && workloadIdentity(src) != peer {
		src = nil // the address is not the peer's: trust the certificate only
	}
	if !peer.IsZero() {
		l.SourcePrincipal = peer.String()
		l.SourceNamespace = peer.Namespace
	}
	if src != nil {
		p.sourceLabels(&l, src, peer)
	}
	destinationLabels(&l, dst, nil)
	if dst != nil {
		l.DestinationPrincipal = p.self.String()
	}
	return l
}

func (p *Proxy) sourceLabels(l *TrafficLabels, w *state.Workload, id identity.Identity) {
	if !id.IsZero() {
		l.SourcePrincipal = id.String()
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
