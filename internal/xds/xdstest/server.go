package xdstest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	delta "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// Type URLs served, the same strings as internal/xds's TypeURLAddress and
// TypeURLAuthorization. They are repeated here so that internal/xds's own
// tests can import this package.
const (
	TypeURLAddress       = "type.googleapis.com/istio.workload.Address"
	TypeURLAuthorization = "type.googleapis.com/istio.security.Authorization"
)

// TB is the part of testing.TB that NewServer uses, so that this package
// does not import testing (the demo links it).
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// Options configures a Server. The zero value serves plaintext on a free
// port of 127.0.0.1 to anyone.
type Options struct {
	// Addr to listen on; "" means "127.0.0.1:0".
	Addr string
	// TLS, if set, makes the server speak TLS (clients use https://).
	TLS *tls.Config
	// Token, if set, is required: a stream without "authorization: Bearer
	// <Token>" is refused with Unauthenticated.
	Token string
}

// Request is one DeltaDiscoveryRequest the server received.
type Request struct {
	// Index is the position in the server's log, counting from 0 across
	// restarts.
	Index int
	// Stream numbers the ADS streams, from 1, across restarts.
	Stream int64
	// Metadata is the gRPC metadata of the stream.
	Metadata metadata.MD
	// Msg is the request as received. Do not modify it.
	Msg *discovery.DeltaDiscoveryRequest
}

// Initial reports whether r opened a subscription (no response nonce).
func (r Request) Initial() bool { return r.Msg.GetResponseNonce() == "" }

// ACK reports whether r accepted a response.
func (r Request) ACK() bool { return !r.Initial() && r.Msg.GetErrorDetail() == nil }

// NACK reports whether r rejected a response.
func (r Request) NACK() bool { return !r.Initial() && r.Msg.GetErrorDetail() != nil }

// Server is an xDS server for ztunnel's two resource types, built on
// go-control-plane's delta server and linear caches. Its resources survive
// Stop and Restart. It is safe for concurrent use.
type Server struct {
	// Immutable after Start.
	opts   Options
	caches map[string]*cache.LinearCache
	mux    *cache.MuxCache

	mu       sync.Mutex
	addr     string // fixed after the first listen so Restart reuses the port
	grpc     *grpc.Server
	cancel   context.CancelFunc
	served   chan struct{} // closed when the current Serve returns
	streamMD map[int64]metadata.MD
	streams  int64 // streams opened by previous incarnations
	log      []Request
	logGrew  chan struct{} // closed and replaced whenever log grows
}

// NewServer starts a Server and stops it when the test ends; it fails the
// test if the server cannot start.
func NewServer(tb TB, opts Options) *Server {
	tb.Helper()
	s, err := Start(opts)
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
		return nil
	}
	tb.Cleanup(s.Stop)
	return s
}

// Start starts a Server. Call Stop when done.
func Start(opts Options) (*Server, error) {
	s := &Server{
		opts:     opts,
		caches:   make(map[string]*cache.LinearCache),
		streamMD: make(map[int64]metadata.MD),
		logGrew:  make(chan struct{}),
		addr:     opts.Addr,
	}
	if s.addr == "" {
		s.addr = "127.0.0.1:0"
	}
	for _, u := range []string{TypeURLAddress, TypeURLAuthorization} {
		s.caches[u] = cache.NewLinearCache(u)
	}
	caches := make(map[string]cache.Cache, len(s.caches))
	for u, c := range s.caches {
		caches[u] = c
	}
	s.mux = &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        caches,
	}
	if err := s.Restart(); err != nil {
		return nil, err
	}
	return s, nil
}

// Addr is the listening address, host:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// URL is the address in XDS_ADDRESS form: http:// or https://.
func (s *Server) URL() string {
	if s.opts.TLS != nil {
		return "https://" + s.Addr()
	}
	return "http://" + s.Addr()
}

// Restart serves again on the same address after Stop. It is a no-op while
// serving.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpc != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("xdstest: listen %s: %w", s.addr, err)
	}
	s.addr = ln.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	srvOpts := []grpc.ServerOption{grpc.WaitForHandlers(true)}
	if s.opts.TLS != nil {
		srvOpts = append(srvOpts, grpc.Creds(credentials.NewTLS(s.opts.TLS)))
	}
	gs := grpc.NewServer(srvOpts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, &ads{
		delta: delta.NewServer(ctx, s.mux, &callbacks{s: s, base: s.streams}),
	})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(ln) // returns when Stop closes the listener
	}()
	s.grpc, s.cancel, s.served = gs, cancel, served
	return nil
}

// Stop closes the listener and every stream at once (as a crashed istiod
// would) and waits for the server's goroutines. Resources are kept for
// Restart. Calling Stop twice is fine.
func (s *Server) Stop() {
	s.mu.Lock()
	gs, cancel, served := s.grpc, s.cancel, s.served
	s.grpc = nil
	s.mu.Unlock()
	if gs == nil {
		return
	}
	// Connections first, so clients see a broken transport rather than a
	// clean end of stream; then the delta server's context.
	gs.Stop()
	cancel()
	<-served
}

// SetAddress adds or replaces an Address resource.
func (s *Server) SetAddress(name string, a *workloadpb.Address) {
	s.Push(TypeURLAddress, map[string]proto.Message{name: a}, nil)
}

// SetAuthorization adds or replaces an Authorization resource.
func (s *Server) SetAuthorization(name string, a *securitypb.Authorization) {
	s.Push(TypeURLAuthorization, map[string]proto.Message{name: a}, nil)
}

// SetRaw adds or replaces a resource of typeURL whose body is exactly value,
// e.g. bytes that do not decode.
func (s *Server) SetRaw(typeURL, name string, value []byte) {
	s.Push(typeURL, map[string]proto.Message{name: Raw(value)}, nil)
}

// Remove deletes a resource.
func (s *Server) Remove(typeURL, name string) {
	s.Push(typeURL, nil, []string{name})
}

// Push changes several resources of one type at once; connected clients get
// them in one response.
func (s *Server) Push(typeURL string, set map[string]proto.Message, remove []string) {
	c, ok := s.caches[typeURL]
	if !ok {
		panic(fmt.Sprintf("xdstest: unsupported type URL %q", typeURL))
	}
	up := make(map[string]types.Resource, len(set))
	for name, m := range set {
		if m == nil {
			panic(fmt.Sprintf("xdstest: nil resource %q", name))
		}
		up[name] = m
	}
	if err := c.UpdateResources(up, remove); err != nil {
		// Only marshalling can fail, and these messages always marshal.
		panic(fmt.Sprintf("xdstest: update %s: %v", typeURL, err))
	}
}

// Raw is a message whose wire form is exactly b: the bytes are kept as
// unknown fields of an empty message, which proto marshalling copies
// verbatim.
func Raw(b []byte) proto.Message {
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(slices.Clone(b))
	return m
}

// Requests returns every request received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// RequestCount is the number of requests received so far; pass it to
// WaitRequest to wait only for requests that arrive after this point.
func (s *Server) RequestCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.log)
}

// WaitRequest returns the first request with Index >= from that match
// accepts, waiting for it until ctx is done.
func (s *Server) WaitRequest(ctx context.Context, from int, match func(Request) bool) (Request, error) {
	for {
		s.mu.Lock()
		grew := s.logGrew
		for _, r := range s.log[min(from, len(s.log)):] {
			if match(r) {
				s.mu.Unlock()
				return r, nil
			}
		}
		from = len(s.log)
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return Request{}, fmt.Errorf("xdstest: wait for request: %w", ctx.Err())
		case <-grew:
		}
	}
}

// ads serves only DeltaAggregatedResources; the state-of-the-world stream
// is left unimplemented (ztunnel never uses it).
type ads struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	delta delta.Server
}

func (a *ads) DeltaAggregatedResources(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return a.delta.DeltaStreamHandler(st, resource.AnyType)
}

// callbacks records streams and requests. base offsets go-control-plane's
// stream ids (which restart at 1 with each delta server) so that ids stay
// unique across restarts.
type callbacks struct {
	s    *Server
	base int64
}

var errUnauthenticated = errors.New("missing or wrong bearer token")

func (cb *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	s := cb.s
	s.mu.Lock()
	s.streamMD[cb.base+id] = md.Copy()
	if cb.base+id > s.streams {
		s.streams = cb.base + id
	}
	s.mu.Unlock()
	if s.opts.Token != "" && !slices.Contains(md.Get("authorization"), "Bearer "+s.opts.Token) {
		return status.Error(codes.Unauthenticated, errUnauthenticated.Error())
	}
	return nil
}

func (cb *callbacks) OnDeltaStreamClosed(int64, *corev3.Node) {}

func (cb *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	s := cb.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, Request{
		Index:    len(s.log),
		Stream:   cb.base + id,
		Metadata: s.streamMD[cb.base+id],
		Msg:      proto.Clone(req).(*discovery.DeltaDiscoveryRequest),
	})
	close(s.logGrew)
	s.logGrew = make(chan struct{})
	return nil
}

func (cb *callbacks) OnStreamDeltaResponse(int64, *discovery.DeltaDiscoveryRequest, *discovery.DeltaDiscoveryResponse) {
}
