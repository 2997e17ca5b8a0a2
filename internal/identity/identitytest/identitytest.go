package identitytest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/caclient"
)

// NewManager returns a running Manager backed by ca (a fresh ephemeral
// LocalCA for cluster.local if nil); it is closed at test cleanup.
func NewManager(t testing.TB, ca identity.CA) *identity.Manager {
	t.Helper()
	if ca == nil {
		ca = NewLocalCA(t, identity.DefaultTrustDomain)
	}
	m, err := identity.NewManager(identity.ManagerOptions{CA: ca})
	if err != nil {
		t.Fatalf("identitytest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return m
}

// NewLocalCA returns an ephemeral LocalCA or fails the test.
func NewLocalCA(t testing.TB, trustDomain string) *identity.LocalCA {
	t.Helper()
	ca, err := identity.NewLocalCA(trustDomain)
	if err != nil {
		t.Fatalf("identitytest: %v", err)
	}
	return ca
}

// CAServerOptions configures StartCAServer.
type CAServerOptions struct {
	// CA signs; nil → a fresh LocalCA for cluster.local.
	CA identity.CA
	// Token, if set, must arrive as "authorization: Bearer <Token>".
	Token string
}

// Request is what the test CA saw in one CreateCertificate call.
type Request struct {
	Identity             identity.Identity // what was signed
	ImpersonatedIdentity string
	ValidityDuration     int64
	Metadata             metadata.MD
}

// CAServer is a running test Istio CA.
type CAServer struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer

	// URL is the CA_ADDRESS to use, https://127.0.0.1:<port>.
	URL string
	// RootFile is a PEM file with the root of the server's own TLS
	// certificate (CA_ROOT_CA).
	RootFile string
	CA       identity.CA
	Token    string

	mu       sync.Mutex
	requests []Request // guarded by mu
	fail     error     // guarded by mu
}

// StartCAServer starts a gRPC IstioCertificateService on 127.0.0.1:0,
// stopped at test cleanup. It signs the ImpersonatedIdentity if one is
// given, otherwise the CSR's URI SAN (a real CA would use the caller's
// token instead).
func StartCAServer(t testing.TB, opts CAServerOptions) *CAServer {
	t.Helper()
	s := &CAServer{CA: opts.CA, Token: opts.Token}
	if s.CA == nil {
		s.CA = NewLocalCA(t, identity.DefaultTrustDomain)
	}
	serving, rootPEM, err := servingCert()
	if err != nil {
		t.Fatalf("identitytest: CA serving certificate: %v", err)
	}
	s.RootFile = filepath.Join(t.TempDir(), "ca-root.pem")
	if err := os.WriteFile(s.RootFile, rootPEM, 0o600); err != nil {
		t.Fatalf("identitytest: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("identitytest: listen: %v", err)
	}
	s.URL = "https://" + ln.Addr().String()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serving},
		MinVersion:   tls.VersionTLS12,
	})))
	securityv1alpha1.RegisterIstioCertificateServiceServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// ClientOptions returns caclient options that reach s with its token.
func (s *CAServer) ClientOptions() caclient.Options {
	return caclient.Options{Address: s.URL, RootCA: s.RootFile, StaticToken: s.Token, ClusterID: "Kubernetes"}
}

// Requests returns the calls seen so far, rejected ones included.
func (s *CAServer) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// SetError makes later calls fail with err (a status error is sent as is,
// others as Unavailable); nil restores signing.
func (s *CAServer) SetError(err error) {
	s.mu.Lock()
	s.fail = err
	s.mu.Unlock()
}

// CreateCertificate implements IstioCertificateServiceServer.
func (s *CAServer) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	rec := Request{
		ImpersonatedIdentity: req.GetMetadata().GetFields()[caclient.ImpersonatedIdentityKey].GetStringValue(),
		ValidityDuration:     req.GetValidityDuration(),
		Metadata:             md.Copy(),
	}
	s.mu.Lock()
	fail := s.fail
	s.mu.Unlock()
	id, err := s.check(md, req, rec.ImpersonatedIdentity)
	rec.Identity = id
	s.mu.Lock()
	s.requests = append(s.requests, rec)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if fail != nil {
		if _, ok := status.FromError(fail); ok {
			return nil, fail
		}
		return nil, status.Error(codes.Unavailable, fail.Error())
	}
	chain, roots, err := s.CA.Sign(ctx, []byte(req.GetCsr()), id, time.Duration(req.GetValidityDuration())*time.Second)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "sign: %v", err)
	}
	resp := &securityv1alpha1.IstioCertificateResponse{}
	for _, c := range chain {
		resp.CertChain = append(resp.CertChain, string(identity.EncodeCertificatesPEM([]*x509.Certificate{c})))
	}
	resp.CertChain = append(resp.CertChain, string(identity.EncodeCertificatesPEM(roots)))
	return resp, nil
}

func (s *CAServer) check(md metadata.MD, req *securityv1alpha1.IstioCertificateRequest, impersonated string) (identity.Identity, error) {
	if s.Token != "" {
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+s.Token {
			return identity.Identity{}, status.Error(codes.Unauthenticated, "request authenticate failure")
		}
	}
	if impersonated != "" {
		id, err := identity.Parse(impersonated)
		if err != nil {
			return identity.Identity{}, status.Errorf(codes.InvalidArgument, "impersonated identity: %v", err)
		}
		return id, nil
	}
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil {
		return identity.Identity{}, status.Error(codes.InvalidArgument, "CSR is not PEM")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil || len(csr.URIs) == 0 {
		return identity.Identity{}, status.Error(codes.InvalidArgument, "CSR has no URI SAN")
	}
	id, err := identity.Parse(csr.URIs[0].String())
	if err != nil {
		return identity.Identity{}, status.Errorf(codes.InvalidArgument, "CSR SAN: %v", err)
	}
	return id, nil
}

// servingCert makes a root and a server certificate for 127.0.0.1 and
// localhost signed by it; it returns the server pair and the root PEM.
func servingCert() (tls.Certificate, []byte, error) {
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	rootTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "identitytest CA root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "istiod"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "istiod.istio-system.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, key.Public(), rootKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), nil
}
