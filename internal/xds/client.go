package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const (
	// initialBackoff is the first reconnect delay. Upstream starts at 10ms;
	// 100ms still reconnects promptly after an istiod rollout but keeps a
	// fleet of ztunnels from hammering a control plane that is down.
	initialBackoff = 100 * time.Millisecond
	// maxBackoff caps the delay between attempts (upstream's cap).
	maxBackoff = 15 * time.Second
	// maxRecvMsgSize is upstream's max_decoding_message_size: a full push of
	// a large mesh arrives as one message per type.
	maxRecvMsgSize = 200 << 20
)

// Options configures a Client.
type Options struct {
	// Address is XDS_ADDRESS: "https://host:port" (TLS) or "http://host:port"
	// (plaintext, for tests and demos). A missing port means 443 or 80.
	Address string
	// RootCAPEM is the trust root for the server's certificate (PEM). If
	// nil, RootCAFile is read on every connection attempt; if that is empty
	// too, the system roots are used. Ignored for http://.
	RootCAPEM  []byte
	RootCAFile string
	// AltHostname (ALT_XDS_HOSTNAME) is a second name accepted in the
	// server's certificate besides the host of Address. May be empty.
	AltHostname string
	// Token returns the bearer token sent as "authorization: Bearer <token>"
	// (with "clusterid: <Node.ClusterID>"). It is called once per
	// connection attempt so a rotated token file is picked up. Nil means no
	// authentication headers.
	Token func() (string, error)
	// Headers (XDS_HEADER_*) are added to every stream's gRPC metadata.
	Headers map[string]string
	// Node describes this ztunnel to the server.
	Node NodeInfo
	// Handler receives the resources. Required.
	Handler Handler
	// Logger may be nil (no logs).
	Logger *slog.Logger
	// Registerer may be nil (no metrics).
	Registerer prometheus.Registerer
	// OnStreamEnd, if not nil, is called from Run each time a stream ends
	// (or could not be opened), with the termination reason label and the
	// error; readiness uses it to say why config has not arrived.
	OnStreamEnd func(reason string, err error)
}

// Client is a delta ADS client for ztunnel's two resource types. Create it
// with New, then call Run once.
type Client struct {
	// Immutable after New.
	opts       Options
	target     string // host:port for gRPC
	useTLS     bool
	serverName string
	node       *corev3.Node
	log        *slog.Logger
	m          *metrics
	ready      chan struct{}
	newBackoff func() *backoff // tests shorten the delays

	running atomic.Bool

	// Owned by the Run goroutine.
	versions  *versionTracker
	notReady  map[string]bool // types whose first accepted response is pending
	readyOnce sync.Once
}

// New validates opts and builds a Client. It does not connect.
func New(opts Options) (*Client, error) {
	if opts.Handler == nil {
		return nil, errors.New("xds: new client: Handler is required")
	}
	target, useTLS, host, err := parseAddress(opts.Address)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "xds", "address", opts.Address)
	node, err := opts.Node.node()
	if err != nil {
		// Upstream logs and skips a bad ISTIO_METAJSON_* value; so do we.
		log.Error("node metadata entry skipped", "err", err)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Client{
		opts:       opts,
		target:     target,
		useTLS:     useTLS,
		serverName: host,
		node:       node,
		log:        log,
		m:          m,
		ready:      make(chan struct{}),
		newBackoff: func() *backoff { return newBackoff(initialBackoff, maxBackoff) },
		versions:   newVersionTracker(),
		notReady:   make(map[string]bool, len(subscribedTypes)),
	}
	for _, u := range subscribedTypes {
		c.notReady[u] = true
	}
	return c, nil
}

// parseAddress splits XDS_ADDRESS into a gRPC target, whether to use TLS,
// and the host name to verify.
func parseAddress(addr string) (target string, useTLS bool, host string, err error) {
	u, err := url.Parse(addr)
	if err != nil {
		return "", false, "", fmt.Errorf("xds: parse address %q: %w", addr, err)
	}
	port := u.Port()
	switch u.Scheme {
	case "https":
		useTLS = true
		if port == "" {
			port = "443"
		}
	case "http":
		if port == "" {
			port = "80"
		}
	default:
		return "", false, "", fmt.Errorf("xds: parse address %q: scheme must be https or http", addr)
	}
	host = u.Hostname()
	if host == "" {
		return "", false, "", fmt.Errorf("xds: parse address %q: missing host", addr)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "", false, "", fmt.Errorf("xds: parse address %q: only scheme://host:port is accepted", addr)
	}
	return net.JoinHostPort(host, port), useTLS, host, nil
}

// Ready is closed once the first response of each type has been received
// and accepted in full (upstream blocks readiness the same way). It stays
// closed across reconnects.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Run connects, keeps the stream up and reconnects with jittered
// exponential backoff until ctx is done. It returns nil after ctx is done
// and everything it started has stopped; it returns an error only if called
// twice.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xds: run: already running")
	}
	bo := c.newBackoff()
	for attempt := 1; ; attempt++ {
		healthy, reason, err := c.runStream(ctx, attempt)
		if ctx.Err() != nil {
			return nil
		}
		c.m.terminations.WithLabelValues(string(reason)).Inc()
		if c.opts.OnStreamEnd != nil {
			c.opts.OnStreamEnd(string(reason), err)
		}
		delay := bo.next(healthy)
		level := slog.LevelWarn
		if reason == reasonReconnect || reason == reasonComplete {
			level = slog.LevelInfo
		}
		c.log.Log(ctx, level, "xds stream ended", "attempt", attempt, "reason", string(reason), "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// runStream runs one connection: dial, open the stream, send the initial
// requests, then answer every response until the stream ends. healthy says
// whether at least one response arrived.
func (c *Client) runStream(ctx context.Context, attempt int) (healthy bool, reason terminationReason, err error) {
	md, err := c.streamMetadata()
	if err != nil {
		return false, reasonConnectionError, err
	}
	creds, err := c.transportCredentials()
	if err != nil {
		return false, reasonConnectionError, err
	}
	conn, err := grpc.NewClient(c.target,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
	)
	if err != nil {
		return false, reasonConnectionError, fmt.Errorf("xds: dial %s: %w", c.target, err)
	}
	defer conn.Close()

	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
	if err != nil {
		return false, reasonConnectionError, fmt.Errorf("xds: open stream to %s: %w", c.target, err)
	}
	for _, typeURL := range subscribedTypes {
		req := &discovery.DeltaDiscoveryRequest{
			Node:                    c.node,
			TypeUrl:                 typeURL,
			ResourceNamesSubscribe:  []string{"*"},
			InitialResourceVersions: c.versions.initial(typeURL),
		}
		c.log.Debug("sending initial request", "attempt", attempt, "type_url", typeURL, "initial_resources", len(req.InitialResourceVersions))
		if err := stream.Send(req); err != nil {
			// io.EOF means the stream is gone; Recv has the real status.
			if !errors.Is(err, io.EOF) {
				return false, reasonConnectionError, fmt.Errorf("xds: send initial request: %w", err)
			}
			break
		}
	}

	defer c.m.connected.Set(0)
	for {
		resp, err := stream.Recv()
		if err != nil {
			reason, err := classify(err, healthy)
			return healthy, reason, err
		}
		if !healthy {
			healthy = true
			c.m.connected.Set(1)
			c.log.Info("xds stream established", "attempt", attempt)
		}
		c.handleResponse(resp)
		out := c.versions.apply(c.opts.Handler, resp)
		c.m.resources.WithLabelValues(out.typeURL).Set(float64(c.versions.count(out.typeURL)))
		req := out.request()
		if out.nack() {
			c.m.nacks.WithLabelValues(out.typeURL).Inc()
			c.log.Warn("rejecting xds response (NACK)", "type_url", out.typeURL, "nonce", out.nonce,
				"resources", len(resp.GetResources()), "removed", out.removes, "error", req.GetErrorDetail().GetMessage())
		} else {
			c.log.Debug("accepting xds response (ACK)", "type_url", out.typeURL, "nonce", out.nonce,
				"resources", out.upserts, "removed", out.removes)
		}
		if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
			return healthy, reasonError, fmt.Errorf("xds: send ack: %w", err)
		}
		if !out.nack() {
			c.markReady(out.typeURL)
		}
	}
}

// handleResponse records per-response metrics and logs.
func (c *Client) handleResponse(resp *discovery.DeltaDiscoveryResponse) {
	c.m.recordResponse(resp)
	c.log.Debug("received xds response", "type_url", resp.GetTypeUrl(), "nonce", resp.GetNonce(),
		"resources", len(resp.GetResources()), "removed", len(resp.GetRemovedResources()))
}

// markReady notes an accepted response of typeURL and closes Ready once
// every subscribed type has had one.
func (c *Client) markReady(typeURL string) {
	if !c.notReady[typeURL] {
		return
	}
	delete(c.notReady, typeURL)
	if len(c.notReady) == 0 {
		c.readyOnce.Do(func() {
			c.log.Info("xds ready: initial configuration received for every type")
			close(c.ready)
		})
	}
}

// classify turns the error that ended a stream into a termination reason,
// following upstream: an OK end is Complete; the codes and messages gRPC
// uses for routine server-side closes (GOAWAY, max connection age, a server
// restart) are Reconnect; a stream that never delivered anything failed to
// connect; the rest are Error.
func classify(err error, healthy bool) (terminationReason, error) {
	if errors.Is(err, io.EOF) {
		return reasonComplete, nil
	}
	st, _ := status.FromError(err)
	err = fmt.Errorf("xds: stream: %w", err)
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unknown:
		return reasonReconnect, err
	case codes.Unavailable:
		msg := strings.ToLower(st.Message())
		for _, routine := range []string{"transport is closing", "goaway", "draining", "error reading from server: eof"} {
			if healthy && strings.Contains(msg, routine) {
				return reasonReconnect, err
			}
		}
		if !healthy {
			return reasonConnectionError, err
		}
	}
	return reasonError, err
}

// transportCredentials builds the credentials for one connection attempt,
// reading RootCAFile afresh so a rotated root is picked up.
func (c *Client) transportCredentials() (credentials.TransportCredentials, error) {
	if !c.useTLS {
		return insecure.NewCredentials(), nil
	}
	roots, err := c.rootPool()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: c.serverName, MinVersion: tls.VersionTLS12}
	if alt := c.opts.AltHostname; alt != "" {
		// Standard verification checks one name only; verify the chain
		// ourselves and accept either name.
		cfg.InsecureSkipVerify = true
		names := []string{c.serverName, alt}
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyEither(cs, roots, names)
		}
	}
	return credentials.NewTLS(cfg), nil
}

func (c *Client) rootPool() (*x509.CertPool, error) {
	pem := c.opts.RootCAPEM
	if pem == nil && c.opts.RootCAFile != "" {
		b, err := os.ReadFile(c.opts.RootCAFile)
		if err != nil {
			return nil, fmt.Errorf("xds: read root CA: %w", err)
		}
		pem = b
	}
	if pem == nil {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("xds: load system roots: %w", err)
		}
		return pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("xds: load root CA: no PEM certificate found")
	}
	return pool, nil
}

// verifyEither verifies the peer chain against roots and accepts the
// leaf if it is valid for any of names.
func verifyEither(cs tls.ConnectionState, roots *x509.CertPool, names []string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("xds: verify server: no certificate")
	}
	inter := x509.NewCertPool()
	for _, cert := range cs.PeerCertificates[1:] {
		inter.AddCert(cert)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
		return fmt.Errorf("xds: verify server: %w", err)
	}
	var errs []error
	for _, n := range names {
		err := leaf.VerifyHostname(n)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("xds: verify server: %w", errors.Join(errs...))
}

// backoff is a jittered exponential delay. It is not safe for concurrent
// use; Run owns it.
type backoff struct {
	initial, max time.Duration
	cur          time.Duration
	jitter       func() float64 // in [0, 1)
}

func newBackoff(initial, max time.Duration) *backoff {
	return &backoff{initial: initial, max: max, jitter: rand.Float64}
}

// next returns the delay before the next attempt. reset (the stream that
// just ended had delivered responses) starts over from the initial delay; otherwise the delay doubles up to max. Half of the delay
// is random ("equal jitter") so that ztunnels disconnected together by an
// istiod restart do not reconnect in lockstep.
func (b *backoff) next(reset bool) time.Duration {
	switch {
	case reset || b.cur == 0:
		b.cur = b.initial
	default:
		b.cur = min(b.cur*2, b.max)
	}
	half := b.cur / 2
	return half + time.Duration(b.jitter()*float64(b.cur-half))
}
