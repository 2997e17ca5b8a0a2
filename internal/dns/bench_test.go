package dns

import (
	"context"
	"net/netip"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// BenchmarkAnswerMesh: one mesh question answered in process (the work per
// query after parsing): short name expansion, lookups, answer building.
func BenchmarkAnswerMesh(b *testing.B) {
	for _, tc := range []struct{ name, qname string }{
		{"full", "shop.default.svc.cluster.local."},
		{"short", "shop."},
		{"workload hostname", "db-0.db.default.svc.cluster.local."},
	} {
		b.Run(tc.name, func(b *testing.B) {
			res, err := NewResolver(ResolverOptions{State: newStore(b).Snapshot})
			if err != nil {
				b.Fatal(err)
			}
			s := &Server{opts: ServerOptions{Client: Client{Namespace: "default", Name: "client"}}, res: res, log: res.log, dial: defaultDial}
			req := new(mdns.Msg)
			req.SetQuestion(tc.qname, mdns.TypeA)
			src := netip.MustParseAddr("127.0.0.1")
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if resp := s.answer(ctx, req, "udp", src); len(resp.Answer) == 0 {
					b.Fatal("no answer")
				}
			}
		})
	}
}

// BenchmarkQueryLoopback: a whole query over loopback UDP and TCP (a TCP
// connection reused for 100 queries), client included.
func BenchmarkQueryLoopback(b *testing.B) {
	s := startServer(b, ResolverOptions{})
	for _, proto := range []string{"udp", "tcp"} {
		b.Run(proto, func(b *testing.B) {
			c := &mdns.Client{Net: proto, Timeout: 2 * time.Second}
			conn, err := c.Dial(s.addr(proto))
			if err != nil {
				b.Fatal(err)
			}
			defer func() { conn.Close() }()
			m := new(mdns.Msg)
			m.SetQuestion("shop.", mdns.TypeA)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				// miekg's server closes a TCP connection after 128 queries.
				if n++; proto == "tcp" && n%100 == 0 {
					conn.Close()
					if conn, err = c.Dial(s.addr(proto)); err != nil {
						b.Fatal(err)
					}
				}
				resp, _, err := c.ExchangeWithConn(m, conn)
				if err != nil || len(resp.Answer) != 1 {
					b.Fatal(err, resp)
				}
			}
		})
	}
}
