package caclient_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/caclient"
	"github.com/ztunnel-go/ztunnel/internal/identity/identitytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var podID = identity.New("", "default", "productpage")

func newClient(t *testing.T, opts caclient.Options) *caclient.Client {
	t.Helper()
	c, err := caclient.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func sign(t *testing.T, c identity.CA, id identity.Identity, ttl time.Duration) (*identity.Certificate, error) {
	t.Helper()
	csr, key, err := identity.GenerateCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chain, roots, err := c.Sign(ctx, csr, id, ttl)
	if err != nil {
		return nil, err
	}
	return identity.NewCertificate(id, key, chain, roots, time.Now())
}

func TestSignThroughManager(t *testing.T) {
	local := identitytest.NewLocalCA(t, "")
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{CA: local, Token: "node-token"})
	opts := srv.ClientOptions()
	opts.Impersonate = true
	opts.ClusterID = "cluster-1"
	opts.Headers = map[string]string{"X-Extra": "v1"}
	c := newClient(t, opts)
	m := identitytest.NewManager(t, c)

	cert, err := m.Get(context.Background(), podID)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Identity != podID || len(cert.Roots) != 1 || !cert.Roots[0].Equal(local.Roots()[0]) {
		t.Fatalf("certificate %v roots %d", cert.Identity, len(cert.Roots))
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("CA saw %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	for _, tc := range []struct{ name, got, want string }{
		{"authorization", first(r.Metadata.Get("authorization")), "Bearer node-token"},
		{"clusterid", first(r.Metadata.Get("clusterid")), "cluster-1"},
		{"extra header", first(r.Metadata.Get("x-extra")), "v1"},
		{"ImpersonatedIdentity", r.ImpersonatedIdentity, podID.String()},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if r.ValidityDuration != int64(identity.DefaultCertTTL/time.Second) {
		t.Errorf("validity_duration = %d, want %d", r.ValidityDuration, int64(identity.DefaultCertTTL/time.Second))
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func TestTokenChecks(t *testing.T) {
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{Token: "right"})
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*caclient.Options)
		wantCode codes.Code // codes.OK: success
		wantErr  string     // a local (non-gRPC) error
	}{
		{name: "static token", mutate: func(*caclient.Options) {}},
		{name: "token file with newline", mutate: func(o *caclient.Options) { o.TokenFile = write("good", "right\n") }},
		{name: "wrong token", mutate: func(o *caclient.Options) { o.StaticToken = "wrong" }, wantCode: codes.Unauthenticated},
		{name: "no token", mutate: func(o *caclient.Options) { o.StaticToken = "" }, wantCode: codes.Unauthenticated},
		{name: "empty token file", mutate: func(o *caclient.Options) { o.TokenFile = write("empty", "") },
			wantErr: "exists but is empty"},
		{name: "missing token file", mutate: func(o *caclient.Options) { o.TokenFile = filepath.Join(dir, "absent") },
			wantErr: "read token: open " + filepath.Join(dir, "absent") + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := srv.ClientOptions()
			tc.mutate(&opts)
			_, err := sign(t, newClient(t, opts), podID, time.Hour)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Sign error = %v, want %q", err, tc.wantErr)
				}
			case status.Code(err) != tc.wantCode:
				t.Fatalf("Sign error = %v, want code %s", err, tc.wantCode)
			}
		})
	}
}

func TestTokenFileReReadEachRequest(t *testing.T) {
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{Token: "v1"})
	tokenFile := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(tokenFile, []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := srv.ClientOptions()
	opts.StaticToken, opts.TokenFile = "", tokenFile
	c := newClient(t, opts)
	if _, err := sign(t, c, podID, time.Hour); err != nil {
		t.Fatalf("first Sign: %v", err)
	}
	if err := os.WriteFile(tokenFile, []byte("v2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sign(t, c, podID, time.Hour); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Sign after the token changed = %v, want Unauthenticated (token re-read)", err)
	}
	if got := first(srv.Requests()[1].Metadata.Get("authorization")); got != "Bearer v2" {
		t.Fatalf("second request authorization = %q", got)
	}
}

func TestNoImpersonationByDefault(t *testing.T) {
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{})
	if _, err := sign(t, newClient(t, srv.ClientOptions()), podID, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	r := srv.Requests()[0]
	if r.ImpersonatedIdentity != "" || r.Identity != podID || r.ValidityDuration != 90 {
		t.Fatalf("request %+v", r)
	}
}

func TestCAServerTrust(t *testing.T) {
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{})
	otherRoots := string(identitytest.NewLocalCA(t, "").RootsPEM())
	goodRoots, err := os.ReadFile(srv.RootFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		rootCA  string
		wantErr string
	}{
		{name: "root file", rootCA: srv.RootFile},
		{name: "inline PEM", rootCA: string(goodRoots)},
		{name: "other root inline", rootCA: otherRoots, wantErr: "certificate signed by unknown authority"},
		{name: "system roots", rootCA: "SYSTEM", wantErr: "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := srv.ClientOptions()
			opts.RootCA = tc.rootCA
			_, err := sign(t, newClient(t, opts), podID, time.Hour)
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Sign error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestRootFileReloaded(t *testing.T) {
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{})
	rootFile := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(rootFile, identitytest.NewLocalCA(t, "").RootsPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := srv.ClientOptions()
	opts.RootCA = rootFile
	c := newClient(t, opts)
	if _, err := sign(t, c, podID, time.Hour); err == nil {
		t.Fatal("Sign trusted a CA outside the root file")
	}
	good, err := os.ReadFile(srv.RootFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootFile, good, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(rootFile, later, later); err != nil {
		t.Fatal(err)
	}
	// gRPC reconnects with backoff after the failed handshake, so poll.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := sign(t, c, podID, time.Hour)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sign still failing after the root file was fixed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestNewRejects(t *testing.T) {
	srv := identitytest.StartCAServer(t, identitytest.CAServerOptions{})
	for _, tc := range []struct {
		name    string
		mutate  func(*caclient.Options)
		wantErr string
	}{
		{name: "http address", mutate: func(o *caclient.Options) { o.Address = "http://istiod:15012" }, wantErr: "want https://host:port"},
		{name: "address with path", mutate: func(o *caclient.Options) { o.Address = "https://istiod:15012/x" }, wantErr: "want https://host:port"},
		{name: "bare host", mutate: func(o *caclient.Options) { o.Address = "istiod:15012" }, wantErr: "want https://host:port"},
		{name: "empty root", mutate: func(o *caclient.Options) { o.RootCA = "" }, wantErr: "root CA: empty"},
		{name: "root neither file nor PEM", mutate: func(o *caclient.Options) { o.RootCA = "/no/such/root.pem" },
			wantErr: "not an existing file, SYSTEM, or PEM certificates"},
		{name: "bad header name", mutate: func(o *caclient.Options) { o.Headers = map[string]string{"bad header": "x"} },
			wantErr: `header "bad header": not a valid gRPC metadata name`},
		{name: "reserved header name", mutate: func(o *caclient.Options) { o.Headers = map[string]string{"grpc-timeout": "1"} },
			wantErr: "not a valid gRPC metadata name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := srv.ClientOptions()
			tc.mutate(&opts)
			c, err := caclient.New(opts)
			if err == nil {
				_ = c.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseChain(t *testing.T) {
	ca := identitytest.NewLocalCA(t, "")
	csr, _, err := identity.GenerateCSR(podID)
	if err != nil {
		t.Fatal(err)
	}
	chain, roots, err := ca.Sign(context.Background(), csr, podID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := string(identity.EncodeCertificatesPEM(chain))
	rootPEM := string(identity.EncodeCertificatesPEM(roots))
	twoRoots := rootPEM + string(identitytest.NewLocalCA(t, "").RootsPEM())
	for _, tc := range []struct {
		name                 string
		in                   []string
		wantChain, wantRoots int
		wantErr              string
	}{
		{name: "leaf and root", in: []string{leafPEM, rootPEM}, wantChain: 1, wantRoots: 1},
		{name: "leaf, intermediate, root", in: []string{leafPEM, rootPEM, rootPEM}, wantChain: 2, wantRoots: 1},
		{name: "several roots in the last element", in: []string{leafPEM, twoRoots}, wantChain: 1, wantRoots: 2},
		{name: "leaf and chain in one element", in: []string{leafPEM + rootPEM, rootPEM}, wantChain: 2, wantRoots: 1},
		{name: "empty", in: nil, wantErr: "empty certificate chain"},
		{name: "no root", in: []string{leafPEM}, wantErr: "certificate chain has no root certificate (1 element)"},
		{name: "garbage leaf", in: []string{"nope", rootPEM}, wantErr: "cert_chain[0]: no PEM certificate found"},
		{name: "garbage root", in: []string{leafPEM, "nope"}, wantErr: "cert_chain[1] (roots): no PEM certificate found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, r, err := caclient.ParseChain(tc.in)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("ParseChain error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(c) != tc.wantChain || len(r) != tc.wantRoots {
				t.Fatalf("ParseChain = %d, %d, %v; want %d, %d", len(c), len(r), err, tc.wantChain, tc.wantRoots)
			}
			if !c[0].Equal(chain[0]) {
				t.Fatal("first certificate is not the leaf")
			}
		})
	}
}

func FuzzParseChain(f *testing.F) {
	f.Add("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", "x")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		chain, roots, err := caclient.ParseChain([]string{a, b})
		if err == nil && (len(chain) == 0 || len(roots) == 0 || chain[0] == (*x509.Certificate)(nil)) {
			t.Fatalf("ParseChain accepted an incomplete chain")
		}
	})
}
