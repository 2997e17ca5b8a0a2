package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/ztunnel-go/ztunnel/internal/dns"
	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/proxy"
)

// startShared runs in-pod mode: the CNI agent hands over each pod's network
// namespace over ZDS, and a proxy is started inside it.
func (a *app) startShared(ctx context.Context) error {
	if err := a.startDNSResolver(false); err != nil {
		return err
	}
	ready := a.ready.Register("inpod snapshot")
	certs := newCertReadiness(a.certs, a.ready.Register("certificates"))
	c, err := inpod.New(inpod.Options{
		UDSPath:   a.cfg.InpodUDS,
		PodServer: &podServer{a: a, certs: certs, ctx: a.runCtx},
		Netns:     inpod.NetnsOptions{Mark: a.cfg.PacketMark, ReusePort: a.cfg.InpodPortReuse},
		OnReady: func(ok bool) {
			if ok {
				certs.closeSet()
				ready()
			}
		},
		// Readiness names why the snapshot is missing: the last ZDS error.
		OnConnectError: func(err error) {
			a.ready.SetDetail("inpod snapshot", "ZDS "+err.Error())
		},
		Logger:     a.levels.Logger("inpod"),
		Registerer: a.reg,
	})
	if err != nil {
		return err
	}
	a.admin.Register("workloadState", func() (any, error) { return c.WorkloadState(), nil })
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(runCtx); err != nil {
			a.log.Error("inpod client stopped", "err", err)
		}
	}()
	a.stoppers = append(a.stoppers, func(ctx context.Context) {
		c.Shutdown(ctx)
		cancel()
		<-done
	})
	return nil
}

// podServer starts one proxy per pod, inside the pod's network namespace.
type podServer struct {
	a     *app
	certs *certReadiness
	ctx   context.Context // ends at shutdown
}

func (s *podServer) StartPod(ctx context.Context, uid string, info inpod.WorkloadInfo, ns *inpod.Netns) (inpod.Pod, error) {
	a := s.a
	defer a.trimmer.soon() // setting a pod up runs cold code (memory.go)
	mark := a.cfg.PacketMark
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return ns.Dial(ctx, network, addr, mark)
	}
	var dialFrom func(ctx context.Context, network, addr string, src netip.Addr) (net.Conn, error)
	if os := a.cfg.OriginalSource; os == nil || *os {
		dialFrom = func(ctx context.Context, network, addr string, src netip.Addr) (net.Conn, error) {
			return ns.Dial(ctx, network, addr, mark, inpod.DialFrom(src))
		}
	}
	pool, err := a.newPool(dial)
	if err != nil {
		return nil, err
	}
	p, err := proxy.New(proxy.Options{
		State:                 a.store.Snapshot,
		Pool:                  pool,
		Certs:                 a.certs,
		Dial:                  dial,
		DialFrom:              dialFrom,
		RequireOriginalSource: a.cfg.OriginalSource != nil && *a.cfg.OriginalSource,
		Local:                 proxy.LocalWorkload{Namespace: info.Namespace, Name: info.Name, ServiceAccount: info.ServiceAccount},
		TrustDomain:           a.cfg.TrustDomain,
		Network:               a.cfg.Network,
		ClusterID:             a.cfg.ClusterID,
		Metrics:               a.metrics,
		Registerer:            a.reg,
		Workers:               a.setup,
		Logger:                a.levels.Logger("access").With("pod", info.Namespace+"/"+info.Name),
	})
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.certs.track(s.ctx, p.Identity())
	pod := &pod{p: p, pool: pool}
	// DNS first: once 15001 listens the pod's lookups are captured too.
	pod.dns, err = a.startDNS(dns.Client{Namespace: info.Namespace, Name: info.Name},
		dns.ListenFuncs{
			Listen:       func(network, addr string) (net.Listener, error) { return ns.Listen(network, addr) },
			ListenPacket: func(network, addr string) (net.PacketConn, error) { return ns.ListenPacket(network, addr) },
		},
		func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(ctx, network, addr, mark)
		})
	if err != nil {
		pod.Drain(ctx)
		return nil, err
	}
	for _, l := range []struct {
		port  int
		serve func(net.Listener)
	}{
		{proxy.OutboundPort, p.ServeOutbound},
		{proxy.InboundPlaintextPort, p.ServeInboundPlaintext},
		{proxy.HBONEPort, p.ServeHBONE},
	} {
		ln, err := ns.Listen("tcp", fmt.Sprintf(":%d", l.port), inpod.ListenTransparent(false))
		if err != nil {
			pod.Drain(ctx)
			return nil, err
		}
		if l.port == proxy.HBONEPort {
			ln = trimmingListener{ln, a.trimmer}
		}
		l.serve(ln)
	}
	return pod, nil
}

type pod struct {
	p    *proxy.Proxy
	pool *hbone.Pool
	dns  *dns.Server // nil when the DNS proxy is off
}

func (p *pod) Drain(ctx context.Context) error {
	dnsDone := make(chan struct{})
	go func() {
		defer close(dnsDone)
		if p.dns != nil {
			p.dns.Shutdown(ctx) // in parallel: a forward in flight may take its timeout
		}
	}()
	defer func() { <-dnsDone }()
	err := p.p.Shutdown(ctx)
	p.pool.Shutdown(ctx)
	p.pool.Close()
	return err
}
