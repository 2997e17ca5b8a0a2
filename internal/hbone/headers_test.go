package hbone

import (
	"bytes"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // "" means error
	}{
		{name: "ipv4", in: "10.0.0.1:8080", want: "10.0.0.1:8080"},
		{name: "ipv6", in: "[fd00::1]:80", want: "[fd00::1]:80"},
		{name: "ipv4-mapped is unmapped", in: "[::ffff:10.0.0.1]:80", want: "10.0.0.1:80"},
		{name: "hostname", in: "example.com:80"},
		{name: "no port", in: "10.0.0.1"},
		{name: "port zero", in: "10.0.0.1:0"},
		{name: "port too big", in: "10.0.0.1:65536"},
		{name: "zone", in: "[fe80::1%eth0]:80"},
		{name: "empty", in: ""},
		{name: "unbracketed ipv6", in: "fd00::1:80"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAuthority(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("ParseAuthority(%q) = %v, want error", tc.in, got)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("ParseAuthority(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestForwarded(t *testing.T) {
	// The format cases are upstream's build_forwarded tests.
	format := []struct {
		name   string
		client string
		host   string
		want   string
	}{
		{name: "ipv4", client: "127.0.0.1:80", want: `for="127.0.0.1:80"`},
		{name: "ipv6", client: "[::1]:80", want: `for="[::1]:80"`},
		{name: "with service host", client: "127.0.0.1:80", host: "example.com", want: `for="127.0.0.1:80";host=example.com`},
	}
	for _, tc := range format {
		t.Run("format/"+tc.name, func(t *testing.T) {
			if got := FormatForwarded(netip.MustParseAddrPort(tc.client), tc.host); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
	// The parse cases are upstream's parse_forwarded_host tests.
	parse := []struct {
		name string
		in   string
		want string // "" means not found
	}{
		{name: "plain", in: "by=identifier;for=identifier;host=example.com;proto=https", want: "example.com"},
		{name: "quoted", in: `by=identifier;for=identifier;host="example.com";proto=https`, want: "example.com"},
		{name: "absent", in: "by=identifier;for=identifier;proto=https"},
		{name: "empty", in: "by=identifier;for=identifier;host=;proto=https"},
		{name: "non-ascii anywhere", in: `for=for;by=by;host=host;proto="pröto"`},
		{name: "ours", in: `for="10.0.0.1:80";host=svc.ns.svc.cluster.local`, want: "svc.ns.svc.cluster.local"},
	}
	for _, tc := range parse {
		t.Run("parse/"+tc.name, func(t *testing.T) {
			got, ok := ParseForwardedHost(tc.in)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("got %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

func TestBaggage(t *testing.T) {
	full := Baggage{ClusterID: "K1", Namespace: "NS1", WorkloadName: "N1", ServiceName: "N2", Revision: "V1", Region: "R", Zone: "Z"}
	tests := []struct {
		name   string
		values []string
		want   Baggage
		ok     bool
	}{
		{
			name:   "upstream example",
			values: []string{"k8s.cluster.name=K1,k8s.namespace.name=NS1,k8s.deployment.name=N1,service.name=N2,service.version=V1"},
			want:   Baggage{ClusterID: "K1", Namespace: "NS1", WorkloadName: "N1", ServiceName: "N2", Revision: "V1"},
			ok:     true,
		},
		{name: "round trip", values: []string{FormatBaggage(full, "pod")}, want: full, ok: true},
		{name: "two header values", values: []string{"k8s.namespace.name=a", "cloud.region=r"}, want: Baggage{Namespace: "a", Region: "r"}, ok: true},
		{name: "unknown keys and members without =", values: []string{"foo=bar,junk,k8s.job.name=j"}, want: Baggage{WorkloadName: "j"}, ok: true},
		{name: "value stops at the next =", values: []string{"service.name=a=b"}, want: Baggage{ServiceName: "a"}, ok: true},
		{name: "non-ascii header", values: []string{"service.name=ä"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseBaggage(tc.values)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	if got, want := FormatBaggage(Baggage{Namespace: "ns", WorkloadName: "w"}, "deployment"), "k8s.namespace.name=ns,k8s.deployment.name=w"; got != want {
		t.Errorf("FormatBaggage = %s, want %s", got, want)
	}
}

func TestTraceParent(t *testing.T) {
	tp := NewTraceParent()
	s := tp.String()
	if len(s) != 55 || !strings.HasPrefix(s, "00-") || !strings.HasSuffix(s, "-00") {
		t.Fatalf("NewTraceParent().String() = %q", s)
	}
	back, err := ParseTraceParent(s)
	if err != nil || back != tp {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if NewTraceParent() == tp {
		t.Error("two random trace parents are equal")
	}
	for _, bad := range []string{
		"",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",   // short
		"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  // separator
		"00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",  // not hex
		"0-00af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  // misplaced dash
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x", // long
	} {
		if _, err := ParseTraceParent(bad); err == nil {
			t.Errorf("ParseTraceParent(%q) succeeded", bad)
		}
	}
	const w3c = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	got, err := ParseTraceParent(w3c)
	if err != nil || got.String() != w3c || got.TraceIDString() != "4bf92f3577b34da6a3ce929d0e0e4736" || got.Flags != 1 {
		t.Errorf("ParseTraceParent(w3c example) = %+v, %v", got, err)
	}
}

func TestKey(t *testing.T) {
	a, b := identity.New("", "ns", "a"), identity.New("", "ns", "b")
	if DstIdentities(b, a, b, identity.Identity{}) != DstIdentities(a, b) {
		t.Error("DstIdentities depends on order or duplicates")
	}
	if got, want := DstIdentities(a, b), "spiffe://cluster.local/ns/ns/sa/a,spiffe://cluster.local/ns/ns/sa/b"; got != want {
		t.Errorf("DstIdentities = %s, want %s", got, want)
	}
	k := Key{Src: a, Dst: DstIdentities(b), Addr: netip.MustParseAddrPort("10.0.0.2:15008")}
	if got, want := k.String(), "(spiffe://cluster.local/ns/ns/sa/a)->10.0.0.2:15008[spiffe://cluster.local/ns/ns/sa/b]"; got != want {
		t.Errorf("Key.String = %s, want %s", got, want)
	}
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[fd00::1]:15008", "[::ffff:1.2.3.4]:1", "example.com:80", "1.2.3.4", "[fe80::1%eth0]:80", ":0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := ParseAuthority(s)
		cerr := checkClientAuthority(s)
		if err != nil {
			return
		}
		// Whatever the server accepts, a client may send, and it
		// survives a round trip.
		if cerr != nil {
			t.Fatalf("server accepts %q but client check says %v", s, cerr)
		}
		back, err := ParseAuthority(ap.String())
		if err != nil || back != ap {
			t.Fatalf("round trip of %q: %v, %v", s, back, err)
		}
	})
}

func FuzzParseForwardedHost(f *testing.F) {
	f.Add(`for="10.0.0.1:80";host=svc.ns.svc.cluster.local`)
	f.Add(`host="x";proto=https`)
	f.Add("host=")
	f.Fuzz(func(t *testing.T, s string) {
		h, ok := ParseForwardedHost(s)
		if ok == (h == "") {
			t.Fatalf("ParseForwardedHost(%q) = %q, %v", s, h, ok)
		}
		if ok && !strings.Contains(s, h) {
			t.Fatalf("host %q not in %q", h, s)
		}
	})
}

func FuzzParseBaggage(f *testing.F) {
	f.Add("k8s.cluster.name=K1,k8s.namespace.name=NS1,k8s.deployment.name=N1,service.name=N2,service.version=V1", "x")
	f.Add("cloud.region=r,cloud.availability_zone=z", "service.name=a=b")
	f.Fuzz(func(t *testing.T, a, b string) {
		got, ok := ParseBaggage([]string{a, b})
		if !ok {
			return
		}
		// Formatting what was parsed and parsing again is stable, as long
		// as no value carries a separator of its own.
		for _, v := range []string{got.ClusterID, got.Namespace, got.WorkloadName, got.ServiceName, got.Revision, got.Region, got.Zone} {
			if strings.ContainsAny(v, ",=") {
				return
			}
		}
		again, ok := ParseBaggage([]string{FormatBaggage(got, "pod")})
		if !ok || again != got {
			t.Fatalf("re-parse of %+v gave %+v, %v", got, again, ok)
		}
	})
}

func FuzzParseTraceParent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0")
	f.Fuzz(func(t *testing.T, s string) {
		tp, err := ParseTraceParent(s)
		if err != nil {
			return
		}
		if !strings.EqualFold(tp.String(), s) {
			t.Fatalf("ParseTraceParent(%q).String() = %q", s, tp.String())
		}
	})
}

// BenchmarkConnectHeaders: the HPACK work of one CONNECT on a long-lived
// connection, both ends (encode on the client, decode on the server),
// with the headers the proxy sends: the same :authority and baggage on
// every stream, a Forwarded and a traceparent that differ on each.
func BenchmarkConnectHeaders(b *testing.B) {
	baggage := FormatBaggage(Baggage{
		ClusterID: "Kubernetes", Namespace: "default", WorkloadName: "client",
		ServiceName: "client", Revision: "v1", Region: "us-east1", Zone: "us-east1-b",
	}, "deployment")
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	dec := hpack.NewDecoder(4096, func(hpack.HeaderField) {})
	client := netip.MustParseAddr("10.244.1.7")
	port := uint16(1024)
	n, total := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		port++
		hdr := ConnectHeader{
			Forwarded:   FormatForwarded(netip.AddrPortFrom(client, port), ""),
			Traceparent: NewTraceParent().String(),
			Baggage:     baggage,
		}
		buf.Reset()
		for _, f := range connectFields("10.244.2.9:8080", &hdr) {
			_ = enc.WriteField(f)
		}
		if _, err := dec.Write(buf.Bytes()); err != nil {
			b.Fatal(err)
		}
		n, total = n+1, total+buf.Len()
	}
	// Averaged: a block is small while :authority and baggage are in the
	// dynamic tables and large each time eviction pushed them out.
	b.ReportMetric(float64(total)/float64(n), "block-bytes")
}

// TestConnectFields: :method and :authority first, then the set fields of
// the ConnectHeader in a fixed order (empty ones left out), then Extra in
// lower case without hop-by-hop fields.
func TestConnectFields(t *testing.T) {
	name := func(f []hpack.HeaderField) []string {
		var s []string
		for _, x := range f {
			s = append(s, x.Name+"="+x.Value)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		h    *ConnectHeader
		want []string
	}{
		{"nil", nil, []string{":method=CONNECT", ":authority=10.0.0.1:80"}},
		{"all", &ConnectHeader{Forwarded: `for="10.0.0.9:4000"`, Traceparent: "00-aa-bb-01", Baggage: "k8s.namespace.name=ns"},
			[]string{":method=CONNECT", ":authority=10.0.0.1:80", `forwarded=for="10.0.0.9:4000"`, "traceparent=00-aa-bb-01", "baggage=k8s.namespace.name=ns"}},
		{"empty left out", &ConnectHeader{Baggage: "b"}, []string{":method=CONNECT", ":authority=10.0.0.1:80", "baggage=b"}},
		{"extra", &ConnectHeader{Traceparent: "t", Extra: http.Header{"X-Test": {"1"}, "Connection": {"close"}}},
			[]string{":method=CONNECT", ":authority=10.0.0.1:80", "traceparent=t", "x-test=1"}},
	} {
		if got := name(connectFields("10.0.0.1:80", tc.h)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
