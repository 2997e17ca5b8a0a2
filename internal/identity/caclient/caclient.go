package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// gRPC metadata and request metadata keys, as upstream sends them.
const (
	headerAuthorization = "authorization"
	headerClusterID     = "clusterid"
	// ImpersonatedIdentityKey is the IstioCertificateRequest.metadata field
	// naming the identity a node proxy asks for (istio pkg/security).
	ImpersonatedIdentityKey = "ImpersonatedIdentity"
)

// Keepalive on the CA connection, as upstream (from Istio's Envoy
// bootstrap): ping after 30 s of silence, give up 10 s later. Pings are sent
// only while a request is in flight, so idle connections do not trip a
// server's ping policy.
const (
	keepaliveTime    = 30 * time.Second
	keepaliveTimeout = 10 * time.Second
)

// Options configures a Client.
type Options struct {
	// Address is CA_ADDRESS, "https://host:port" (port 443 if omitted).
	Address string
	// RootCA is CA_ROOT_CA: the path of an existing PEM file (re-read when
	// it changes), "SYSTEM" for the system roots, or else PEM text.
	RootCA string
	// AltHostname (ALT_CA_HOSTNAME), if set, is also accepted as the CA
	// certificate's name.
	AltHostname string
	// TokenFile, if set, is read on every request; its content is sent as
	// "authorization: Bearer <token>".
	TokenFile string
	// StaticToken is sent instead when TokenFile is empty (AUTH_TOKEN that
	// names no file). Both empty: no authorization header.
	StaticToken string
	// ClusterID is sent as "clusterid" with the token (CLUSTER_ID).
	ClusterID string
	// Impersonate sends ImpersonatedIdentity (node proxy mode, upstream's
	// "shared" proxy mode).
	Impersonate bool
	// Headers are extra gRPC metadata (CA_HEADER_<NAME>=v gives NAME: v);
	// names are lower-cased. authorization/clusterid here are overridden.
	Headers map[string]string
	// Logger may be nil.
	Logger *slog.Logger
}

// Client is an identity.CA backed by the Istio CA. Safe for concurrent use.
type Client struct {
	// immutable after construction
	conn        *grpc.ClientConn
	rpc         securityv1alpha1.IstioCertificateServiceClient
	roots       *rootSource
	host, alt   string
	tokenFile   string
	staticToken string
	clusterID   string
	impersonate bool
	headers     metadata.MD
	log         *slog.Logger
}

var _ identity.CA = (*Client)(nil)

// New validates opts and returns a Client. It does not connect: the first
// Sign does.
func New(opts Options) (*Client, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	target, host, err := parseAddress(opts.Address)
	if err != nil {
		return nil, err
	}
	roots, err := newRootSource(opts.RootCA, log)
	if err != nil {
		return nil, err
	}
	md := metadata.MD{}
	for k, v := range opts.Headers {
		k = strings.ToLower(k)
		if !validMetadataKey(k) {
			return nil, fmt.Errorf("caclient: header %q: not a valid gRPC metadata name", k)
		}
		md.Set(k, v)
	}
	c := &Client{
		roots:       roots,
		host:        host,
		alt:         opts.AltHostname,
		tokenFile:   opts.TokenFile,
		staticToken: opts.StaticToken,
		clusterID:   opts.ClusterID,
		impersonate: opts.Impersonate,
		headers:     md,
		log:         log,
	}
	tlsCfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Go's verification would pin the roots read now; VerifyConnection
		// does the same checks with the roots current at each handshake.
		InsecureSkipVerify: true,
		VerifyConnection:   c.verifyServer,
	}
	c.conn, err = grpc.NewClient(target,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
	)
	if err != nil {
		return nil, fmt.Errorf("caclient: dial %s: %w", opts.Address, err)
	}
	c.rpc = securityv1alpha1.NewIstioCertificateServiceClient(c.conn)
	return c, nil
}

func parseAddress(addr string) (target, host string, err error) {
	u, err := url.Parse(addr)
	if err != nil {
		return "", "", fmt.Errorf("caclient: CA address %q: %w", addr, err)
	}
	if u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", "", fmt.Errorf("caclient: CA address %q: want https://host:port", addr)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(host, port), host, nil
}

func validMetadataKey(k string) bool {
	if k == "" || strings.HasPrefix(k, "grpc-") || strings.HasSuffix(k, "-bin") {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// Close closes the connection to the CA.
func (c *Client) Close() error { return c.conn.Close() }

// Sign implements identity.CA with one CreateCertificate call.
func (c *Client) Sign(ctx context.Context, csrPEM []byte, id identity.Identity, ttl time.Duration) (chain, roots []*x509.Certificate, err error) {
	req := &securityv1alpha1.IstioCertificateRequest{
		Csr:              string(csrPEM),
		ValidityDuration: int64(ttl / time.Second),
	}
	if c.impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			ImpersonatedIdentityKey: structpb.NewStringValue(id.String()),
		}}
	}
	md := c.headers.Copy()
	token, err := c.token()
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: sign %s: %w", id, err)
	}
	if token != "" {
		md.Set(headerAuthorization, "Bearer "+token)
		if c.clusterID != "" {
			md.Set(headerClusterID, c.clusterID)
		}
	}
	resp, err := c.rpc.CreateCertificate(metadata.NewOutgoingContext(ctx, md), req)
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: sign %s: %w", id, err)
	}
	chain, roots, err = ParseChain(resp.GetCertChain())
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: sign %s: response: %w", id, err)
	}
	return chain, roots, nil
}

// token returns the bearer token: the token file's current content, or the
// static token. Surrounding white space (a trailing newline) is dropped, as
// it cannot travel in a header.
func (c *Client) token() (string, error) {
	if c.tokenFile == "" {
		return c.staticToken, nil
	}
	b, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("read token: %s exists but is empty", c.tokenFile)
	}
	return t, nil
}

// ParseChain splits IstioCertificateResponse.cert_chain: every element but
// the last holds the leaf (first) and intermediates; the last holds the
// root or roots. An element may hold several concatenated certificates.
func ParseChain(certChain []string) (chain, roots []*x509.Certificate, err error) {
	switch len(certChain) {
	case 0:
		return nil, nil, errors.New("empty certificate chain")
	case 1:
		return nil, nil, errors.New("certificate chain has no root certificate (1 element)")
	}
	for i, p := range certChain[:len(certChain)-1] {
		certs, err := identity.ParseCertificatesPEM([]byte(p))
		if err != nil {
			return nil, nil, fmt.Errorf("cert_chain[%d]: %w", i, err)
		}
		chain = append(chain, certs...)
	}
	last := len(certChain) - 1
	roots, err = identity.ParseCertificatesPEM([]byte(certChain[last]))
	if err != nil {
		return nil, nil, fmt.Errorf("cert_chain[%d] (roots): %w", last, err)
	}
	return chain, roots, nil
}

// verifyServer checks the CA's certificate: chain to the current roots,
// validity, server-auth usage, and the address host name or AltHostname.
func (c *Client) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("caclient: CA sent no certificate")
	}
	pool, err := c.roots.get()
	if err != nil {
		return fmt.Errorf("caclient: CA roots: %w", err)
	}
	inter := x509.NewCertPool()
	for _, ic := range cs.PeerCertificates[1:] {
		inter.AddCert(ic)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("caclient: verify CA certificate: %w", err)
	}
	if err := leaf.VerifyHostname(c.host); err != nil {
		if c.alt == "" || leaf.VerifyHostname(c.alt) != nil {
			return fmt.Errorf("caclient: verify CA certificate: %w", err)
		}
	}
	return nil
}
