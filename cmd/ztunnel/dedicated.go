package main

import (
	"context"
	"net"

	"github.com/ztunnel-go/ztunnel/internal/dns"
	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/proxy"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
)

// startDedicated serves the one workload of PROXY_WORKLOAD_INFO from the
// process's own network namespace (sidecar-like, or a laptop).
func (a *app) startDedicated(ctx context.Context) error {
	wi := a.cfg.WorkloadInfo
	d := &net.Dialer{Control: sockopt.Mark(a.cfg.PacketMark)}
	pool, err := a.newPool(d.DialContext)
	if err != nil {
		return err
	}
	p, err := proxy.New(proxy.Options{
		State:       a.store.Snapshot,
		Pool:        pool,
		Certs:       a.certs,
		Dial:        d.DialContext,
		Local:       proxy.LocalWorkload{Namespace: wi.Namespace, Name: wi.Name, ServiceAccount: wi.ServiceAccount},
		TrustDomain: a.cfg.TrustDomain,
		Network:     a.cfg.Network,
		ClusterID:   a.cfg.ClusterID,
		Metrics:     a.metrics,
		Registerer:  a.reg,
		Workers:     a.setup,
		Logger:      a.levels.Logger("access"),
	})
	if err != nil {
		pool.Close()
		return err
	}
	a.stoppers = append(a.stoppers, func(ctx context.Context) {
		p.Shutdown(ctx)
		pool.Shutdown(ctx)
	})
	for _, l := range []struct {
		port  int
		serve func(net.Listener)
	}{
		{proxy.OutboundPort, p.ServeOutbound},
		{proxy.InboundPlaintextPort, p.ServeInboundPlaintext},
		{proxy.HBONEPort, p.ServeHBONE},
	} {
		ln, err := listenTCP(l.port)
		if err != nil {
			return err
		}
		l.serve(ln)
	}
	// The workload's own resolv.conf search list applies (upstream's
	// dedicated mode), and its own netns' localhost.
	if err := a.startDNSResolver(true); err != nil {
		return err
	}
	ds, err := a.startDNS(dns.Client{Namespace: wi.Namespace, Name: wi.Name}, dns.LocalListenFuncs, markedDial(d))
	if err != nil {
		return err
	}
	if ds != nil {
		a.stoppers = append(a.stoppers, func(ctx context.Context) { ds.Shutdown(ctx) })
	}
	certs := newCertReadiness(a.certs, a.ready.Register("certificates"))
	certs.track(a.runCtx, p.Identity())
	certs.closeSet()
	a.log.Info("serving workload", "workload", wi.Namespace+"/"+wi.Name, "identity", p.Identity().String())
	return nil
}

// newPool makes an HBONE client pool that dials with dial.
func (a *app) newPool(dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*hbone.Pool, error) {
	return hbone.NewPool(hbone.PoolOptions{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			defer a.trimmer.soon() // a new HBONE connection: TLS handshake, cold code
			return dial(ctx, network, addr)
		},
		TLS:               proxy.PoolTLS(a.certs),
		MaxStreamsPerConn: a.cfg.PoolMaxStreamsPerConn,
		IdleTimeout:       a.cfg.PoolUnusedRelease,
		Logger:            a.levels.Logger("pool"),
		Registerer:        a.reg,
	})
}
