package dns

import (
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// TestResolve asks every kind of name over UDP and over TCP.
func TestResolve(t *testing.T) {
	up := startUpstream(t)
	s := startServer(t, ResolverOptions{Upstreams: []string{up.addr}})
	type want struct {
		rcode int
		addrs []string
		cname string // target of a leading CNAME, if any
		auth  bool   // answered by us, not forwarded
	}
	mesh := func(addrs ...string) want { return want{rcode: mdns.RcodeSuccess, addrs: addrs, auth: true} }
	cases := []struct {
		name  string
		qname string
		qtype uint16
		want  want
	}{
		{"full name A", "shop.default.svc.cluster.local.", mdns.TypeA, mesh("10.96.0.20")},
		{"full name AAAA", "shop.default.svc.cluster.local.", mdns.TypeAAAA, mesh("fd00:96::20")},
		{"short name: client's namespace", "shop.", mdns.TypeA, mesh("10.96.0.20")},
		{"name.namespace", "shop.other.", mdns.TypeA, mesh("10.96.1.20")},
		{"name.namespace.svc", "shop.other.svc.", mdns.TypeA, mesh("10.96.1.20")},
		{"mixed case", "SHOP.Default.Svc.Cluster.Local.", mdns.TypeA, mesh("10.96.0.20")},
		{"search domain appended by the client", "shop.other.default.svc.cluster.local.", mdns.TypeA,
			want{rcode: mdns.RcodeSuccess, addrs: []string{"10.96.1.20"}, cname: "shop.other.", auth: true}},
		{"IPv4-only service asked AAAA: empty, not NXDOMAIN", "v4.default.svc.cluster.local.", mdns.TypeAAAA, mesh()},
		{"wildcard service hostname", "api.wild.example.", mdns.TypeA, mesh("10.96.0.40")},
		{"VIP in another network only", "remote.default.svc.cluster.local.", mdns.TypeA, mesh()},
		{"headless service: endpoint addresses", "headless.default.svc.cluster.local.", mdns.TypeA, mesh("10.1.0.7")},
		{"headless service AAAA", "headless.default.svc.cluster.local.", mdns.TypeAAAA, mesh("fd00::7")},
		{"workload hostname", "db-0.db.default.svc.cluster.local.", mdns.TypeA, mesh("10.1.0.7")},
		{"workload hostname by short form", "db-0.db.", mdns.TypeAAAA, mesh("fd00::7")},
		{"namespace-visible service from another namespace: forwarded", "private.other.svc.cluster.local.", mdns.TypeA, want{rcode: mdns.RcodeNameError}},
		{"VIP-less ServiceEntry: forwarded", "api.external.example.", mdns.TypeA, want{rcode: mdns.RcodeSuccess, addrs: []string{"192.0.2.10"}}},
		{"workload hostname without IPs: forwarded", "vm.example.internal.", mdns.TypeA, want{rcode: mdns.RcodeNameError}},
		{"name outside the mesh: forwarded", upstreamName, mdns.TypeA, want{rcode: mdns.RcodeSuccess, addrs: []string{upstreamIP}}},
		{"unknown name: upstream's NXDOMAIN", "nope.example.org.", mdns.TypeA, want{rcode: mdns.RcodeNameError}},
		{"other type for a mesh name: forwarded", "shop.default.svc.cluster.local.", mdns.TypeMX, want{rcode: mdns.RcodeSuccess}},
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				resp := query(t, proto, s.addr(proto), tc.qname, tc.qtype, 0)
				if resp.Rcode != tc.want.rcode {
					t.Fatalf("rcode %s, want %s", mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[tc.want.rcode])
				}
				if resp.Authoritative != tc.want.auth {
					t.Errorf("authoritative %v, want %v", resp.Authoritative, tc.want.auth)
				}
				if got := addrs(resp); !slices.Equal(got, tc.want.addrs) && (len(got) > 0 || len(tc.want.addrs) > 0) {
					t.Errorf("addresses %v, want %v", got, tc.want.addrs)
				}
				if resp.Question[0].Name != tc.qname {
					t.Errorf("question %q, want the name as asked", resp.Question[0].Name)
				}
				if tc.want.cname != "" {
					c, ok := resp.Answer[0].(*mdns.CNAME)
					if !ok || c.Target != tc.want.cname || c.Hdr.Name != tc.qname {
						t.Errorf("first answer %v, want CNAME %s → %s", resp.Answer[0], tc.qname, tc.want.cname)
					}
				}
				if tc.want.auth {
					for _, rr := range resp.Answer {
						if rr.Header().Ttl != ttl {
							t.Errorf("ttl %d, want %d", rr.Header().Ttl, ttl)
						}
					}
				}
			})
		}
	}
}

// TestTruncation: an answer too big for UDP comes back with TC over UDP,
// whole over TCP or with a big enough EDNS size; for forwarded names, the
// proxy itself retries upstream over TCP when upstream truncates.
func TestTruncation(t *testing.T) {
	up := startUpstream(t)
	s := startServer(t, ResolverOptions{Upstreams: []string{up.addr}})
	for _, tc := range []struct {
		name, proto, qname string
		edns               uint16
		wantTC             bool
		wantN              int // answers; -1: fewer than the whole set
	}{
		{"mesh over UDP", "udp", "big.default.svc.cluster.local.", 0, true, -1},
		{"mesh over UDP with EDNS 4096", "udp", "big.default.svc.cluster.local.", 4096, false, bigVIPs},
		{"mesh over TCP", "tcp", "big.default.svc.cluster.local.", 0, false, bigVIPs},
		{"forwarded over UDP", "udp", bigUpstream, 0, true, -1},
		{"forwarded over TCP (upstream UDP truncated, refetched over TCP)", "tcp", bigUpstream, 0, false, bigUpstreamN},
		{"forwarded over UDP with EDNS 4096", "udp", bigUpstream, 4096, false, bigUpstreamN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(mdns.Msg)
			m.SetQuestion(tc.qname, mdns.TypeA)
			if tc.edns > 0 {
				m.SetEdns0(tc.edns, false)
			}
			// A raw exchange, so miekg's client does not retry over TCP for us.
			c := &mdns.Client{Net: tc.proto, Timeout: 5 * time.Second, UDPSize: 65535}
			resp, _, err := c.Exchange(m, s.addr(tc.proto))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Truncated != tc.wantTC {
				t.Errorf("TC %v, want %v", resp.Truncated, tc.wantTC)
			}
			limit := mdns.MinMsgSize
			if tc.edns > 0 {
				limit = int(tc.edns)
			}
			resp.Compress = true // as sent; Len is otherwise the uncompressed size
			if tc.proto == "udp" && resp.Len() > limit {
				t.Errorf("UDP answer is %d bytes, over the client's %d", resp.Len(), limit)
			}
			n := len(resp.Answer)
			if tc.wantN == -1 && (n >= bigVIPs || n == 0) {
				t.Errorf("%d answers, want some but not all", n)
			} else if tc.wantN > 0 && n != tc.wantN {
				t.Errorf("%d answers, want %d", n, tc.wantN)
			}
		})
	}
}

// TestForwardTimeout: a resolver that never answers gives SERVFAIL within
// the forward timeout, over UDP and TCP, counted as a failure; a dead first
// resolver does not keep the second from answering.
func TestForwardTimeout(t *testing.T) {
	const timeout = 400 * time.Millisecond
	silent := silentUpstream(t)
	refusing := refusingUpstream(t)
	up := startUpstream(t)
	for _, tc := range []struct {
		name      string
		upstreams []string
		rcode     int
		reason    Reason
	}{
		{"only a silent resolver", []string{silent}, mdns.RcodeServerFailure, ReasonForwardTimeout},
		{"silent, then a working one", []string{silent, up.addr}, mdns.RcodeSuccess, ""},
		{"refusing, then a working one", []string{refusing, up.addr}, mdns.RcodeSuccess, ""},
		{"only a refusing one: its answer", []string{refusing}, mdns.RcodeRefused, ""},
		{"no resolver at all", nil, mdns.RcodeServerFailure, ReasonForwardError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, ResolverOptions{Upstreams: tc.upstreams, ForwardTimeout: timeout})
			for _, proto := range []string{"udp", "tcp"} {
				start := time.Now()
				resp := query(t, proto, s.addr(proto), upstreamName, mdns.TypeA, 0)
				took := time.Since(start)
				if resp.Rcode != tc.rcode {
					t.Errorf("%s: rcode %s, want %s", proto, mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[tc.rcode])
				}
				if took > timeout+300*time.Millisecond {
					t.Errorf("%s: answered after %v, timeout %v", proto, took, timeout)
				}
			}
			failures := counter(t, s.reg, "istio_dns_upstream_failures_total", nil)
			if tc.reason != "" {
				if got := counter(t, s.reg, "ztunnel_dns_errors_total", map[string]string{"reason": string(tc.reason)}); got != 2 {
					t.Errorf("errors{reason=%s} = %v, want 2", tc.reason, got)
				}
				if failures != 2 {
					t.Errorf("upstream failures %v, want 2", failures)
				}
			} else if failures != 0 {
				t.Errorf("upstream failures %v, want 0", failures)
			}
		})
	}
}

// TestMetrics: a mesh answer and a forward show up with upstream's names
// and labels; the client workload (found by source address) names the
// canonical service.
func TestMetrics(t *testing.T) {
	up := startUpstream(t)
	s := startServer(t, ResolverOptions{Upstreams: []string{up.addr}})
	query(t, "udp", s.udp, "shop.", mdns.TypeA, 0)
	query(t, "tcp", s.tcp, upstreamName, mdns.TypeAAAA, 0)
	src := map[string]string{"source_canonical_service": "client", "source_canonical_revision": "v1"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range src {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"istio_dns_requests_total", with("request_query_type", "a", "request_protocol", "udp"), 1},
		{"istio_dns_requests_total", with("request_query_type", "aaaa", "request_protocol", "tcp"), 1},
		{"istio_dns_upstream_requests_total", with("request_query_type", "aaaa", "request_protocol", "tcp"), 1},
		{"istio_dns_upstream_requests_total", with("request_query_type", "a"), 0},
		{"istio_dns_upstream_request_duration_seconds", with("request_query_type", "aaaa"), 1},
		{"istio_dns_upstream_failures_total", nil, 0},
	} {
		if got := counter(t, s.reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// TestShutdownWithForwardInFlight: a forward waiting on a silent resolver
// does not hold up a forced shutdown.
func TestShutdownWithForwardInFlight(t *testing.T) {
	silent := silentUpstream(t)
	s := startServer(t, ResolverOptions{Upstreams: []string{silent}, ForwardTimeout: time.Minute})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &mdns.Client{Net: "udp", Timeout: 3 * time.Second}
		m := new(mdns.Msg)
		m.SetQuestion(upstreamName, mdns.TypeA)
		c.Exchange(m, s.udp) // times out: no answer once the server is gone
	}()
	waitFor(t, func() bool { return counter(t, s.reg, "istio_dns_upstream_requests_total", nil) == 1 })
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close took %v with a forward in flight", took)
	}
	<-done
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLifecycle: Close before Start releases the sockets, Close is safe
// twice, and a closed Server does not start.
func TestLifecycle(t *testing.T) {
	res, err := NewResolver(ResolverOptions{State: newStore(t).Snapshot})
	if err != nil {
		t.Fatal(err)
	}
	pcs, lns, err := Listen("127.0.0.1:0", LocalListenFuncs)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ServerOptions{Resolver: res, Client: Client{Namespace: "default"}, PacketConns: pcs, Listeners: lns})
	if err != nil {
		t.Fatal(err)
	}
	addr := lns[0].Addr().String()
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err == nil {
		t.Error("Start after Close succeeded")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("socket still held after Close: %v", err)
	}
	ln.Close()
	if _, err := NewServer(ServerOptions{Resolver: res, PacketConns: pcs}); err == nil {
		t.Error("NewServer without a client namespace succeeded")
	}
}

// deadlineConn records the read deadlines miekg sets on a UDP socket.
type deadlineConn struct {
	net.PacketConn
	mu        sync.Mutex
	deadlines []time.Duration // deadline minus the time it was set
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadlines = append(c.deadlines, time.Until(t))
	c.mu.Unlock()
	return c.PacketConn.SetReadDeadline(t)
}

// TestIdleUDPSocketSleeps: an idle pod's DNS socket must not wake the
// process every few seconds, and a shutdown must still end its read at
// once.
func TestIdleUDPSocketSleeps(t *testing.T) {
	res, err := NewResolver(ResolverOptions{State: newStore(t).Snapshot})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dc := &deadlineConn{PacketConn: pc}
	s, err := NewServer(ServerOptions{Resolver: res, Client: Client{Namespace: "default"}, PacketConns: []net.PacketConn{dc}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	// One query, so the loop has certainly set a deadline at least twice.
	q := new(mdns.Msg)
	q.SetQuestion("nothing.default.svc.cluster.local.", mdns.TypeA)
	if _, _, err := (&mdns.Client{Net: "udp", Timeout: 5 * time.Second}).Exchange(q, pc.LocalAddr().String()); err != nil {
		t.Fatal(err)
	}
	// The answer can reach the client before the loop is back at its next
	// read (CI once saw one deadline): wait for the second, bounded.
	var ds []time.Duration
	waitFor(t, func() bool {
		dc.mu.Lock()
		defer dc.mu.Unlock()
		ds = slices.Clone(dc.deadlines)
		return len(ds) >= 2
	})
	for _, d := range ds {
		if d < time.Hour {
			t.Fatalf("UDP read deadline %v ahead: an idle socket would wake the process that often", d)
		}
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("shutdown took %v with a long read deadline", took)
	}
}
