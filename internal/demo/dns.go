package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// ServeResolver runs a stand-in for the cluster's DNS server (kube-dns) on
// port 53 (UDP and TCP) at the pod's address: it answers A questions for
// the names in records and NXDOMAIN otherwise; names in silent get no
// answer at all (a resolver that is down). The returned func stops it.
func ServeResolver(p *nstest.Pod, records map[string]netip.Addr, silent ...string) (func(), error) {
	addr := netip.AddrPortFrom(p.IP, 53).String()
	var pc net.PacketConn
	if err := p.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		return nil, fmt.Errorf("demo: resolver: %w", err)
	}
	ln, err := p.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("demo: resolver: %w", err)
	}
	h := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		q := r.Question[0]
		name := strings.ToLower(q.Name)
		for _, s := range silent {
			if name == mdns.Fqdn(s) {
				return
			}
		}
		m := new(mdns.Msg)
		m.SetReply(r)
		ip, ok := records[strings.TrimSuffix(name, ".")]
		switch {
		case !ok:
			m.Rcode = mdns.RcodeNameError
		case q.Qtype == mdns.TypeA && ip.Is4():
			m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: ip.AsSlice()})
		}
		w.WriteMsg(m)
	})
	servers := []*mdns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}}
	done := make(chan struct{}, len(servers))
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { srv.ActivateAndServe(); done <- struct{}{} }()
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			return nil, errors.New("demo: resolver did not start")
		}
	}
	return func() {
		for _, srv := range servers {
			srv.Shutdown()
			<-done
		}
	}, nil
}

// Lookup asks one question from inside pod p, the way the pod's resolver
// library would: to server (its nameserver, "ip:53"), over network "udp" or
// "tcp". In the mesh the pod's DNS capture rules hand it to ztunnel.
func Lookup(ctx context.Context, p *nstest.Pod, network, server, name string, qtype uint16) (*mdns.Msg, error) {
	conn, err := p.Dial(ctx, network, server)
	if err != nil {
		return nil, fmt.Errorf("demo: lookup %s: %w", name, err)
	}
	defer conn.Close()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	c := &mdns.Client{Net: network}
	resp, _, err := c.ExchangeWithConnContext(ctx, m, &mdns.Conn{Conn: conn})
	if err != nil {
		return nil, fmt.Errorf("demo: lookup %s: %w", name, err)
	}
	return resp, nil
}

// resolveA returns the first A record of name, looked up from p.
func resolveA(ctx context.Context, p *nstest.Pod, server, name string) (netip.Addr, error) {
	resp, err := Lookup(ctx, p, "udp", server, name, mdns.TypeA)
	if err != nil {
		return netip.Addr{}, err
	}
	if resp.Rcode != mdns.RcodeSuccess {
		return netip.Addr{}, fmt.Errorf("dns %s: %s", name, mdns.RcodeToString[resp.Rcode])
	}
	for _, rr := range resp.Answer {
		if a, ok := rr.(*mdns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A)
			return ip.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("dns %s: no A record", name)
}
