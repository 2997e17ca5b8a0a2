package main

import (
	"context"
	"net"

	"github.com/ztunnel-go/ztunnel/internal/dns"
)

// startDNSResolver makes the one DNS resolver every per-pod (or the
// dedicated) DNS server shares, when ISTIO_META_DNS_CAPTURE is on. Upstream
// resolvers come from DNS_RESOLV_CONF (default /etc/resolv.conf) read here,
// in ztunnel's own (the node's) netns. With staticSearch (dedicated mode,
// as upstream) resolv.conf's search list is stripped from requested names;
// otherwise each pod's Kubernetes search list for its namespace is.
func (a *app) startDNSResolver(staticSearch bool) error {
	if !a.cfg.DNSCapture {
		return nil
	}
	rc, err := dns.ReadResolvConf(a.cfg.DNSResolvConf)
	if err != nil {
		// Mesh names still resolve; the rest get SERVFAIL.
		a.log.Warn("dns proxy: no upstream resolvers, names outside the mesh will fail", "err", err)
	}
	var search []string
	if staticSearch {
		search = append([]string{}, rc.Search...)
	}
	r, err := dns.NewResolver(dns.ResolverOptions{
		State:         a.store.Snapshot,
		ClusterDomain: a.cfg.ClusterDomain,
		Network:       a.cfg.Network,
		SearchDomains: search,
		Upstreams:     rc.Servers,
		Metrics:       dns.NewMetrics(a.reg),
		Logger:        a.levels.Logger("dns"),
	})
	if err != nil {
		return err
	}
	a.dns = r
	a.log.Info("dns proxy enabled", "addr", a.cfg.DNSProxyAddr, "upstreams", rc.Servers)
	return nil
}

// startDNS serves DNS for client on DNS_PROXY_ADDR, on sockets from lf (the
// pod's netns, or ztunnel's own), forwarding with dial. nil when the DNS
// proxy is off.
func (a *app) startDNS(client dns.Client, lf dns.ListenFuncs, dial dns.DialFunc) (*dns.Server, error) {
	if a.dns == nil {
		return nil, nil
	}
	pcs, lns, err := dns.Listen(a.cfg.DNSProxyAddr, lf)
	if err != nil {
		return nil, err
	}
	s, err := dns.NewServer(dns.ServerOptions{
		Resolver:    a.dns,
		Client:      client,
		PacketConns: pcs,
		Listeners:   lns,
		Dial:        dial,
	})
	if err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// markedDial dials from ztunnel's own netns with SO_MARK mark.
func markedDial(d *net.Dialer) dns.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
}
