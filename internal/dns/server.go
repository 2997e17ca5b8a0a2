package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/net/netutil"

	"github.com/ztunnel-go/ztunnel/internal/state"
)

const (
	// udpReadSize is the largest query read over UDP; EDNS clients offer at
	// most 4096 (most 1232). A larger datagram is cut there and then fails
	// to parse: counted, answered FORMERR or dropped.
	udpReadSize = 4096
	// maxTCPConns bounds open TCP connections per server; more wait in the
	// listen backlog. Each is also bounded in time by miekg's read timeout
	// (2 s for the first query) and idle timeout (8 s between queries).
	maxTCPConns = 64
	// startTimeout bounds how long Start waits for miekg to report each
	// socket as served.
	startTimeout = 5 * time.Second
	// udpIdleWake is the read deadline of the UDP serving loop. miekg's
	// default (2 s) only lets its loop notice a shutdown, which closing
	// the socket already does; with it every pod's idle DNS socket woke
	// the process every 2 s, allocated a timeout error and paged cold code
	// back in (1.5 MiB of RSS between text trims, measured on an idle
	// bench ztunnel).
	udpIdleWake = 24 * time.Hour
)

// Client is the pod a Server answers for.
type Client struct {
	Namespace string // required: completes short names, ranks services
	Name      string // with Namespace, matched against the source workload for metric labels
}

// ServerOptions configure a Server. Resolver, Client.Namespace and at least
// one socket are required.
type ServerOptions struct {
	Resolver *Resolver
	Client   Client
	// PacketConns (UDP) and Listeners (TCP) are the bound sockets (see
	// Listen); the Server owns them from NewServer on and closes them.
	PacketConns []net.PacketConn
	Listeners   []net.Listener
	// Dial opens upstream connections for forwarded queries; nil dials from
	// the current netns without a mark.
	Dial DialFunc
	// Logger; nil means the Resolver's.
	Logger *slog.Logger
}

// Server serves DNS for one client (a pod, or the dedicated workload) on
// its sockets: mesh names from the Resolver, the rest forwarded.
type Server struct {
	// immutable after NewServer
	opts ServerOptions
	res  *Resolver
	log  *slog.Logger
	dial DialFunc
	// ctx ends forwards in flight when a shutdown is forced.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	servers  []*mdns.Server // guarded by mu
	running  []*mdns.Server // guarded by mu: those that started serving
	started  bool           // guarded by mu
	shutdown bool           // guarded by mu
	wg       sync.WaitGroup // one per serving goroutine
}

// NewServer checks opts and returns a Server that is not yet serving.
func NewServer(opts ServerOptions) (*Server, error) {
	closeAll := func() {
		for _, pc := range opts.PacketConns {
			pc.Close()
		}
		for _, ln := range opts.Listeners {
			ln.Close()
		}
	}
	switch {
	case opts.Resolver == nil:
		closeAll()
		return nil, errors.New("dns: new server: Resolver is required")
	case opts.Client.Namespace == "":
		closeAll()
		return nil, errors.New("dns: new server: Client.Namespace is required")
	case len(opts.PacketConns)+len(opts.Listeners) == 0:
		return nil, errors.New("dns: new server: no sockets")
	}
	s := &Server{opts: opts, res: opts.Resolver, log: opts.Logger, dial: opts.Dial}
	if s.log == nil {
		s.log = opts.Resolver.log
	}
	if s.dial == nil {
		s.dial = defaultDial
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for _, pc := range opts.PacketConns {
		s.servers = append(s.servers, s.newMiekg(&mdns.Server{PacketConn: pc, UDPSize: udpReadSize, ReadTimeout: udpIdleWake}, "udp"))
	}
	for _, ln := range opts.Listeners {
		s.servers = append(s.servers, s.newMiekg(&mdns.Server{Listener: netutil.LimitListener(ln, maxTCPConns)}, "tcp"))
	}
	return s, nil
}

func (s *Server) newMiekg(srv *mdns.Server, proto string) *mdns.Server {
	srv.Handler = handler{s: s, proto: proto}
	srv.MsgAcceptFunc = s.accept
	srv.MsgInvalidFunc = s.invalid
	return srv
}

// Addrs returns the local addresses served (UDP first).
func (s *Server) Addrs() []net.Addr {
	var out []net.Addr
	for _, pc := range s.opts.PacketConns {
		out = append(out, pc.LocalAddr())
	}
	for _, ln := range s.opts.Listeners {
		out = append(out, ln.Addr())
	}
	return out
}

// Start serves every socket and returns once each is being served.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.shutdown {
		return errors.New("dns: start: already started or shut down")
	}
	s.started = true
	for _, srv := range s.servers {
		up := make(chan struct{})
		failed := make(chan error, 1)
		srv.NotifyStartedFunc = func() { close(up) }
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.ActivateAndServe(); err != nil {
				failed <- err
				s.log.Debug("dns: serve ended", "err", err)
			}
		}()
		select {
		case <-up:
			s.running = append(s.running, srv)
		case err := <-failed:
			return fmt.Errorf("dns: start: %w", err)
		case <-time.After(startTimeout):
			return errors.New("dns: start: socket not served in time")
		}
	}
	return nil
}

// Shutdown stops reading new queries, lets those in progress finish until
// ctx ends, then cancels forwards still waiting, and returns once every
// goroutine is gone. Safe to call twice, and before Start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := !s.shutdown
	s.shutdown = true
	running := s.running
	s.mu.Unlock()
	if !first {
		s.wg.Wait()
		return nil
	}
	var errs []error
	if len(running) > 0 {
		var wg sync.WaitGroup
		var emu sync.Mutex
		for _, srv := range running {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// miekg closes the socket, then waits for handlers or ctx.
				if err := srv.ShutdownContext(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					emu.Lock()
					errs = append(errs, err)
					emu.Unlock()
				}
			}()
		}
		// Forced past the deadline: end forwards so handlers return.
		stop := context.AfterFunc(ctx, s.cancel)
		wg.Wait()
		stop()
	}
	// miekg closed the sockets it served; these close the rest (a Start
	// that failed part way, or none).
	for _, pc := range s.opts.PacketConns {
		pc.Close()
	}
	for _, ln := range s.opts.Listeners {
		ln.Close()
	}
	s.cancel()
	s.wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("dns: shutdown: %w", errors.Join(errs...))
	}
	return nil
}

// Close shuts down at once. Safe to call twice.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return s.Shutdown(ctx)
}

// accept applies miekg's default checks (a query, opcode QUERY or NOTIFY,
// one question, no stray records) and counts each rejection.
func (s *Server) accept(dh mdns.Header) mdns.MsgAcceptAction {
	act := mdns.DefaultMsgAcceptFunc(dh)
	var reason Reason
	switch act {
	case mdns.MsgAccept:
		return act
	case mdns.MsgIgnore:
		reason = ReasonNotRequest
	case mdns.MsgRejectNotImplemented:
		reason = ReasonOpcode
	default:
		reason = ReasonSections
		if dh.Qdcount != 1 {
			reason = ReasonQuestions
		}
	}
	s.reject(reason, fmt.Errorf("id %d: %d questions, %d answers, %d authority, %d additional", dh.Id, dh.Qdcount, dh.Ancount, dh.Nscount, dh.Arcount))
	return act
}

// invalid counts packets miekg could not parse.
func (s *Server) invalid(m []byte, err error) {
	reason := ReasonMalformed
	if len(m) < 12 {
		reason = ReasonShort
	}
	s.reject(reason, fmt.Errorf("%d bytes: %w", len(m), err))
}

func (s *Server) reject(reason Reason, err error) {
	s.res.metrics.countError(reason)
	s.log.Debug("dns: bad request", "reason", string(reason), "err", err, "pod", s.opts.Client.Namespace+"/"+s.opts.Client.Name)
}

type handler struct {
	s     *Server
	proto string
}

func (h handler) ServeDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	src := addrOf(w.RemoteAddr())
	resp := h.s.answer(h.s.ctx, req, h.proto, src)
	if resp == nil {
		return
	}
	fit(req, resp, h.proto)
	if err := w.WriteMsg(resp); err != nil {
		h.s.res.metrics.countError(ReasonWrite)
		h.s.log.Debug("dns: write answer", "err", err, "src", src)
	}
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// answer is the whole query handling after parsing: nil means no answer.
// It never panics on any message miekg can parse (see FuzzAnswer).
func (s *Server) answer(ctx context.Context, req *mdns.Msg, proto string, src netip.Addr) *mdns.Msg {
	switch {
	case req.Response:
		s.reject(ReasonNotRequest, errors.New("response sent as a query"))
		return nil
	case req.Opcode != mdns.OpcodeQuery:
		s.reject(ReasonOpcode, fmt.Errorf("opcode %s", mdns.OpcodeToString[req.Opcode]))
		return reply(req, mdns.RcodeNotImplemented)
	case len(req.Question) != 1:
		s.reject(ReasonQuestions, fmt.Errorf("%d questions", len(req.Question)))
		return reply(req, mdns.RcodeFormatError)
	}
	r := s.res
	q := req.Question[0]
	snap := r.opts.State()
	c := client{namespace: s.opts.Client.Namespace, workload: s.clientWorkload(snap, src)}
	var canonical, revision string
	if c.workload != nil {
		canonical, revision = c.workload.CanonicalName, c.workload.CanonicalRevision
	}
	l := newLabels(q.Qtype, proto, canonical, revision)
	r.metrics.request(l)

	if q.Qclass == mdns.ClassINET && (q.Qtype == mdns.TypeA || q.Qtype == mdns.TypeAAAA) {
		if m, ok := r.find(snap, c, normalize(q.Name)); ok {
			resp := r.meshAnswer(snap, req, m)
			echoEDNS(req, resp)
			if s.log.Enabled(ctx, slog.LevelDebug) { // the hot path: no boxing when off
				s.log.Debug("dns request", "src", src, "proto", proto, "name", q.Name, "type", l[0], "result", "mesh", "answers", len(resp.Answer))
			}
			return resp
		}
	}

	r.metrics.forward(l)
	start := time.Now()
	resp, err := r.forward(ctx, s.dial, req)
	r.metrics.forwardTook(l, time.Since(start))
	if err != nil {
		r.metrics.forwardFailure(l)
		reason := ReasonForwardError
		var e *Error
		if errors.As(err, &e) {
			reason = e.Reason
		}
		r.metrics.countError(reason)
		s.log.Debug("dns request", "src", src, "proto", proto, "name", q.Name, "type", l[0], "result", "forward failed", "reason", string(reason), "err", err)
		resp = reply(req, mdns.RcodeServerFailure)
		echoEDNS(req, resp)
		return resp
	}
	s.log.Debug("dns request", "src", src, "proto", proto, "name", q.Name, "type", l[0], "result", "forwarded", "rcode", mdns.RcodeToString[resp.Rcode], "answers", len(resp.Answer))
	return resp
}

// clientWorkload is the workload at src in state when it is the served pod.
func (s *Server) clientWorkload(snap *state.Snapshot, src netip.Addr) *state.Workload {
	if !src.IsValid() {
		return nil
	}
	w := snap.WorkloadByAddr(s.res.opts.Network, src)
	if w == nil || w.Namespace != s.opts.Client.Namespace || (s.opts.Client.Name != "" && w.Name != s.opts.Client.Name) {
		return nil
	}
	return w
}

// reply is an answer to req with rcode and no records.
func reply(req *mdns.Msg, rcode int) *mdns.Msg {
	resp := new(mdns.Msg)
	resp.SetRcode(req, rcode)
	resp.RecursionAvailable = true
	return resp
}

// echoEDNS adds an OPT record to our own answers when the query had one,
// offering what the client offered (at least 512), as upstream does.
func echoEDNS(req, resp *mdns.Msg) {
	opt := req.IsEdns0()
	if opt == nil || resp.IsEdns0() != nil {
		return
	}
	resp.SetEdns0(max(opt.UDPSize(), mdns.MinMsgSize), opt.Do())
}

// fit truncates resp to what the client can take: over UDP 512 bytes, or
// the EDNS size it offered, with TC set so it retries over TCP; over TCP
// the 64 KiB message limit.
func fit(req, resp *mdns.Msg, proto string) {
	size := mdns.MaxMsgSize
	if proto == "udp" {
		size = mdns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), mdns.MinMsgSize)
		}
	}
	resp.Truncate(size)
}
