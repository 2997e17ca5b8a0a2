package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// meshConfig is the state every test resolves against. Addresses in it are
// only data: no test sends traffic to them.
const meshConfig = `workloads:
- uid: c1//Pod/default/client
  name: client
  namespace: default
  workloadIps: ["127.0.0.1"]
  canonicalName: client
  canonicalRevision: v1
- uid: c1//Pod/default/db-0
  name: db-0
  namespace: default
  hostname: db-0.db.default.svc.cluster.local
  workloadIps: ["10.1.0.7", "fd00::7"]
  services:
    "default/headless.default.svc.cluster.local": {80: 80}
- uid: c1//Pod/default/vm
  name: vm
  namespace: default
  hostname: vm.example.internal
services:
- {name: shop, namespace: default, hostname: shop.default.svc.cluster.local, vips: ["/10.96.0.20", "/fd00:96::20"]}
- {name: shop, namespace: other, hostname: shop.other.svc.cluster.local, vips: ["/10.96.1.20"]}
- {name: v4, namespace: default, hostname: v4.default.svc.cluster.local, vips: ["/10.96.0.30"], ipFamilies: IPv4}
- {name: wild, namespace: default, hostname: "*.wild.example", vips: ["/10.96.0.40"]}
- {name: remote, namespace: default, hostname: remote.default.svc.cluster.local, vips: ["remote/10.96.0.50"]}
- {name: headless, namespace: default, hostname: headless.default.svc.cluster.local}
- {name: external, namespace: default, hostname: api.external.example}
- {name: private, namespace: other, hostname: private.other.svc.cluster.local, vips: ["/10.96.1.60"], visibility: Namespace}
- {name: big, namespace: default, hostname: big.default.svc.cluster.local, vips: [%s]}
`

// bigVIPs is enough A records for an answer over 512 bytes.
const bigVIPs = 40

func newStore(t testing.TB) *state.Store {
	t.Helper()
	var vips []string
	for i := range bigVIPs {
		vips = append(vips, fmt.Sprintf(`"/10.97.0.%d"`, i+1))
	}
	s, err := state.New(state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := xds.Load("mesh.yaml", []byte(fmt.Sprintf(meshConfig, strings.Join(vips, ", "))), s); err != nil {
		t.Fatal(err)
	}
	return s
}

// upstream is a fake upstream resolver on 127.0.0.1 (UDP and TCP, one port).
type upstream struct {
	addr    string
	queries chan string // names asked, "proto name"
}

// Records the fake upstream knows. Its UDP answers are cut at 512 bytes
// with TC, as a real resolver's.
const (
	upstreamName = "www.example.org."
	upstreamIP   = "192.0.2.1"
	bigUpstream  = "many.example.org."
	bigUpstreamN = 60
)

// udpTCPPair listens on one 127.0.0.1 port for both UDP and TCP, as a
// resolver does. The port comes from the UDP bind; if another test's TCP
// socket already holds it, another port is tried.
func udpTCPPair(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	var last error
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
		last = err
	}
	t.Fatalf("no port free for both UDP and TCP: %v", last)
	return nil, nil
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{queries: make(chan string, 1000)}
	pc, ln := udpTCPPair(t)
	u.addr = pc.LocalAddr().String()
	h := func(proto string) mdns.HandlerFunc {
		return func(w mdns.ResponseWriter, r *mdns.Msg) {
			q := r.Question[0]
			select {
			case u.queries <- proto + " " + q.Name:
			default:
			}
			m := new(mdns.Msg)
			m.SetReply(r)
			switch {
			case q.Qtype == mdns.TypeA && strings.EqualFold(q.Name, upstreamName):
				m.Answer = append(m.Answer, mustRR(t, q.Name+" 60 IN A "+upstreamIP))
			case q.Qtype == mdns.TypeA && strings.EqualFold(q.Name, "api.external.example."):
				m.Answer = append(m.Answer, mustRR(t, q.Name+" 60 IN A 192.0.2.10"))
			case q.Qtype == mdns.TypeA && strings.EqualFold(q.Name, bigUpstream):
				for i := range bigUpstreamN {
					m.Answer = append(m.Answer, mustRR(t, fmt.Sprintf("%s 60 IN A 192.0.2.%d", q.Name, i+1)))
				}
			case q.Qtype == mdns.TypeMX:
				m.Answer = append(m.Answer, mustRR(t, q.Name+" 60 IN MX 10 mail.example.org."))
			default:
				m.Rcode = mdns.RcodeNameError
			}
			if proto == "udp" {
				m.Truncate(mdns.MinMsgSize)
			}
			w.WriteMsg(m)
		}
	}
	servers := []*mdns.Server{
		{PacketConn: pc, Handler: h("udp")},
		{Listener: ln, Handler: h("tcp")},
	}
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
	}
	t.Cleanup(func() {
		for _, srv := range servers {
			srv.Shutdown()
		}
	})
	return u
}

func mustRR(t testing.TB, s string) mdns.RR {
	rr, err := mdns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// refusingUpstream answers every query REFUSED, over UDP only.
func refusingUpstream(t testing.TB) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		w.WriteMsg(m.SetRcode(r, mdns.RcodeRefused))
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// silentUpstream takes queries on 127.0.0.1 and never answers (UDP read and
// dropped; TCP accepted and left open).
func silentUpstream(t testing.TB) string {
	t.Helper()
	pc, ln := udpTCPPair(t)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 4096)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { pc.Close(); ln.Close(); <-done; <-done })
	return pc.LocalAddr().String()
}

// testServer is a Server on 127.0.0.1:0 (UDP and TCP) for the default/client pod.
type testServer struct {
	*Server
	udp, tcp string
	reg      *prometheus.Registry
}

func startServer(t testing.TB, ropts ResolverOptions) *testServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	if ropts.State == nil {
		ropts.State = newStore(t).Snapshot
	}
	if ropts.Metrics == nil {
		ropts.Metrics = NewMetrics(reg)
	}
	res, err := NewResolver(ropts)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ServerOptions{
		Resolver:    res,
		Client:      Client{Namespace: "default", Name: "client"},
		PacketConns: []net.PacketConn{pc},
		Listeners:   []net.Listener{ln},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return &testServer{Server: s, udp: pc.LocalAddr().String(), tcp: ln.Addr().String(), reg: reg}
}

func (s *testServer) addr(proto string) string {
	if proto == "tcp" {
		return s.tcp
	}
	return s.udp
}

// query asks one question; edns > 0 adds an OPT record offering that size.
func query(t testing.TB, proto, addr, name string, qtype uint16, edns uint16) *mdns.Msg {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	if edns > 0 {
		m.SetEdns0(edns, false)
	}
	c := &mdns.Client{Net: proto, Timeout: 5 * time.Second}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s %s: %v", proto, name, mdns.TypeToString[qtype], err)
	}
	return resp
}

// addrs are the A/AAAA addresses of an answer, sorted.
func addrs(m *mdns.Msg) []string {
	var out []netip.Addr
	for _, rr := range m.Answer {
		switch rr := rr.(type) {
		case *mdns.A:
			a, _ := netip.AddrFromSlice(rr.A)
			out = append(out, a.Unmap())
		case *mdns.AAAA:
			a, _ := netip.AddrFromSlice(rr.AAAA)
			out = append(out, a)
		}
	}
	ss := make([]string, 0, len(out))
	for _, a := range sortAddrs(out) {
		ss = append(ss, a.String())
	}
	return ss
}

func sortAddrs(a []netip.Addr) []netip.Addr {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j].Less(a[j-1]); j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
	return a
}

// counter reads one sample of a counter vector from reg (0 if absent).
func counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
