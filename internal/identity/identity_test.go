package identity_test

import (
	"crypto/x509"
	"errors"
	"net/url"
	"testing"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    identity.Identity
		wantErr bool
	}{
		{name: "istio form", in: "spiffe://cluster.local/ns/default/sa/bookinfo", want: identity.New("", "default", "bookinfo")},
		{name: "other trust domain", in: "spiffe://example.org/ns/a/sa/b", want: identity.New("example.org", "a", "b")},
		{name: "not spiffe", in: "https://cluster.local/ns/a/sa/b", wantErr: true},
		{name: "non-istio path", in: "spiffe://cluster.local/workload/x", wantErr: true},
		{name: "empty namespace", in: "spiffe://cluster.local/ns//sa/b", wantErr: true},
		{name: "extra segment", in: "spiffe://cluster.local/ns/a/sa/b/c", wantErr: true},
		{name: "swapped keys", in: "spiffe://cluster.local/sa/a/ns/b", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := identity.Parse(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Parse(%q) error = %v, wantErr %v", tc.in, err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if err == nil && got.String() != tc.in {
				t.Fatalf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}
}

func TestFromCertificate(t *testing.T) {
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	for _, tc := range []struct {
		name    string
		uris    []string
		want    identity.Identity
		wantErr error
	}{
		{name: "one spiffe id", uris: []string{"spiffe://td/ns/a/sa/b"}, want: identity.New("td", "a", "b")},
		{name: "skips non-istio URIs", uris: []string{"https://x/y", "spiffe://td/other", "spiffe://td/ns/a/sa/b"}, want: identity.New("td", "a", "b")},
		{name: "none", uris: nil, wantErr: identity.ErrNoSPIFFEID},
		{name: "only foreign", uris: []string{"spiffe://td/path"}, wantErr: identity.ErrNoSPIFFEID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &x509.Certificate{}
			for _, u := range tc.uris {
				c.URIs = append(c.URIs, mustURL(u))
			}
			got, err := identity.FromCertificate(c)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("FromCertificate = %v, %v; want %v, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"spiffe://cluster.local/ns/a/sa/b", "spiffe://x/ns//sa/", "spiffe://%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := identity.Parse(s)
		if err != nil {
			return
		}
		again, err := identity.Parse(id.String())
		if err != nil || again != id {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
		if id.URL().String() != id.String() {
			t.Fatalf("URL %q != String %q", id.URL(), id.String())
		}
	})
}
