package dns

import (
	"context"
	"net/netip"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// FuzzAnswer feeds arbitrary packets through what the server does with
// them after reading: parse (as miekg does), answer, fit to the client,
// pack. Nothing may panic, and every answer must pack.
//
//	go test -run '^$' -fuzz FuzzAnswer -fuzztime 60s ./internal/dns/
func FuzzAnswer(f *testing.F) {
	for _, edit := range []func(m *mdns.Msg){
		func(m *mdns.Msg) {},
		func(m *mdns.Msg) { m.Question[0].Name = "shop." },
		func(m *mdns.Msg) { m.Question[0].Qtype = mdns.TypeAAAA; m.SetEdns0(4096, true) },
		func(m *mdns.Msg) { m.Question[0].Name = "big.default.svc.cluster.local." },
		func(m *mdns.Msg) { m.Question[0].Name = "a.wild.example." },
		func(m *mdns.Msg) { m.Question[0].Name = upstreamName },
		func(m *mdns.Msg) { m.Question[0].Qtype = mdns.TypeMX },
		func(m *mdns.Msg) { m.Question = append(m.Question, m.Question[0]) },
		func(m *mdns.Msg) { m.Opcode = mdns.OpcodeNotify },
		func(m *mdns.Msg) { m.Question[0].Qclass = mdns.ClassCHAOS },
	} {
		f.Add(packed(f, edit), true)
	}
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c}, false)
	up := startUpstream(f)
	res, err := NewResolver(ResolverOptions{
		State:          newStore(f).Snapshot,
		Upstreams:      []string{up.addr},
		ForwardTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{opts: ServerOptions{Client: Client{Namespace: "default", Name: "client"}}, res: res, log: res.log, dial: defaultDial}
	src := netip.MustParseAddr("127.0.0.1")
	f.Fuzz(func(t *testing.T, pkt []byte, udp bool) {
		req := new(mdns.Msg)
		if err := req.Unpack(pkt); err != nil {
			return // miekg answers FORMERR or drops; counted in TestBadInput
		}
		proto := "tcp"
		if udp {
			proto = "udp"
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp := s.answer(ctx, req, proto, src)
		if resp == nil {
			return
		}
		fit(req, resp, proto)
		out, err := resp.Pack()
		if err != nil {
			t.Fatalf("answer does not pack: %v\n%v", err, resp)
		}
		if udp && len(out) > 65535 {
			t.Fatalf("UDP answer of %d bytes", len(out))
		}
	})
}
