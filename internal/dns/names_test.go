package dns

import (
	"slices"
	"testing"
)

func TestAliases(t *testing.T) {
	d := newDomains("cluster.local")
	for _, tc := range []struct {
		name, ns string
		want     []alias
	}{
		{"one label", "ns1", []alias{{name: "shop"}, {name: "shop.ns1.svc.cluster.local"}}},
		{"name.ns", "ns1", []alias{{name: "shop.ns2"}, {name: "shop.ns2.svc.cluster.local"}, {name: "shop.ns2.ns1.svc.cluster.local"}}},
		{"name.ns.svc", "ns1", []alias{{name: "shop.ns2.svc"}, {name: "shop.ns2.svc.cluster.local"}, {name: "shop.ns2.svc.svc.cluster.local"}}},
		{"pod.sub.ns", "ns1", []alias{{name: "db-0.db.ns2"}, {name: "db-0.db.ns2.svc.cluster.local"}}},
		{"pod.sub.ns.svc", "ns1", []alias{{name: "db-0.db.ns2.svc"}, {name: "db-0.db.ns2.svc.cluster.local"}}},
		{"full name strips to shorter aliases", "ns1", []alias{
			{name: "shop.ns1.svc.cluster.local"},
			{name: "shop", stripped: "shop"},
			{name: "shop.ns1", stripped: "shop.ns1"},
			{name: "shop.ns1.ns1.svc.cluster.local", stripped: "shop.ns1"},
			{name: "shop.ns1.svc", stripped: "shop.ns1.svc"},
			{name: "shop.ns1.svc.svc.cluster.local", stripped: "shop.ns1.svc"},
		}},
		{"external name under a search domain", "ns1", []alias{
			{name: "www.example.com.ns1.svc.cluster.local"},
			{name: "www.example.com", stripped: "www.example.com"},
			{name: "www.example.com.svc.cluster.local", stripped: "www.example.com"},
			{name: "www.example.com.ns1", stripped: "www.example.com.ns1"},
			{name: "www.example.com.ns1.svc", stripped: "www.example.com.ns1.svc"},
		}},
		{"five labels outside the cluster", "ns1", []alias{{name: "a.b.c.d.example"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.want[0].name
			got := d.aliases(in, tc.ns, d.kubeSearch(tc.ns))
			if !slices.Equal(got, tc.want) {
				t.Errorf("aliases(%q, %q):\n got %v\nwant %v", in, tc.ns, got, tc.want)
			}
		})
	}
}

func TestWildcards(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"a.b.c", []string{"a.b.c", "*.b.c", "*.c"}},
		{"single", []string{"single"}},
		{"", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			wildcards(tc.name, func(s string) bool { got = append(got, s); return true })
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTrimDomain(t *testing.T) {
	for _, tc := range []struct {
		name, domain, want string
		ok                 bool
	}{
		{"name.ns.svc.cluster.local", "svc.cluster.local", "name.ns", true},
		{"name.ns.a.different.domain", "svc.cluster.local", "", false},
		{"svc.cluster.local", "svc.cluster.local", "", false},
		{"xsvc.cluster.local", "svc.cluster.local", "", false},
	} {
		t.Run(tc.name+"/"+tc.domain, func(t *testing.T) {
			got, ok := trimDomain(tc.name, tc.domain)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %q %v, want %q %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
