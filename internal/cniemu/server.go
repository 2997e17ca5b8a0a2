package cniemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// Defaults, as istio-cni's ztunnel server.
const (
	// defaultAckTimeout: istio-cni's readWriteDeadline for hello and Acks.
	defaultAckTimeout = 5 * time.Second
	// defaultKeepalive: how often an idle connection is probed.
	defaultKeepalive = 5 * time.Second
	// probeTimeout: the probe is a read that must time out (ztunnel speaks
	// only when spoken to).
	probeTimeout = 10 * time.Millisecond
)

// ErrNoConnection: AddPod was called while no ztunnel is connected. The pod
// is still cached and goes out with the next snapshot (istio-cni says "no
// ztunnel connection" and does the same).
var ErrNoConnection = errors.New("cniemu: no ztunnel connection")

// Options configure a Server.
type Options struct {
	// Path of the SOCK_SEQPACKET socket (ztunnel's INPOD_UDS). A stale
	// socket file there is removed. Required.
	Path string
	// AckTimeout bounds the wait for the hello and for each Ack (default 5 s).
	AckTimeout time.Duration
	// KeepaliveInterval is how often an idle connection is probed (default 5 s).
	KeepaliveInterval time.Duration
	// Logger may be nil.
	Logger *slog.Logger
}

// AckRecord is one answer ztunnel gave.
type AckRecord struct {
	Conn  int        // connection number, from 1
	Kind  inpod.Kind // 0 for SendRaw
	UID   string
	Error string // empty: success
}

type cachedPod struct {
	uid   string
	info  *zdspb.WorkloadInfo
	netns *os.File // nil: netns unknown, sent as Keep in snapshots
}

// Server is the emulated node agent.
type Server struct {
	// immutable after New
	opts Options
	log  *slog.Logger
	ln   *net.UnixListener

	mu        sync.Mutex
	pods      map[string]*cachedPod // guarded by mu
	order     []string              // guarded by mu: insertion order, for stable snapshots
	conns     []*conn               // guarded by mu: newest last
	nconns    int                   // guarded by mu
	acks      []AckRecord           // guarded by mu
	snapshots int                   // guarded by mu: snapshots fully acked
	changed   chan struct{}         // guarded by mu: closed and replaced on every record

	wg sync.WaitGroup
}

// New listens on opts.Path.
func New(opts Options) (*Server, error) {
	if opts.Path == "" {
		return nil, errors.New("cniemu: Path is required")
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = defaultAckTimeout
	}
	if opts.KeepaliveInterval <= 0 {
		opts.KeepaliveInterval = defaultKeepalive
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.Remove(opts.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cniemu: remove stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: opts.Path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("cniemu: listen: %w", err)
	}
	return &Server{opts: opts, log: log, ln: ln, pods: map[string]*cachedPod{}, changed: make(chan struct{})}, nil
}

// Path is the socket path.
func (s *Server) Path() string { return s.opts.Path }

// Run accepts ztunnel connections until ctx is done or Close is called,
// then closes every connection and returns once they are gone.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = s.ln.Close() })
	defer stop()
	var err error
	for {
		var uc *net.UnixConn
		uc, err = s.ln.AcceptUnix()
		if err != nil {
			break
		}
		c := s.addConn(uc)
		s.wg.Go(func() {
			defer s.delConn(c)
			if err := s.serve(ctx, c); err != nil {
				s.log.Warn("ztunnel connection ended", "conn", c.id, "err", err)
			}
		})
	}
	cancel()
	s.DropConnections()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("cniemu: accept: %w", err)
}

// Close stops the listener (Run then returns) and releases cached netns FDs.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for _, p := range s.pods {
		if p.netns != nil {
			_ = p.netns.Close()
		}
	}
	clear(s.pods)
	s.order = nil
	s.mu.Unlock()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// AddPod caches the pod and, if ztunnel is connected, sends it to the newest
// connection (with a dup of netns in SCM_RIGHTS) and waits for the Ack; an
// Ack error is returned. netns may be nil: the pod is then sent as
// KeepWorkload in later snapshots and not sent now. The caller keeps netns.
func (s *Server) AddPod(ctx context.Context, uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	var own *os.File
	if netns != nil {
		var err error
		if own, err = dupFile(netns); err != nil {
			return err
		}
	}
	s.mu.Lock()
	if old, ok := s.pods[uid]; ok {
		if old.netns != nil {
			_ = old.netns.Close()
		}
	} else {
		s.order = append(s.order, uid)
	}
	p := &cachedPod{uid: uid, info: info, netns: own}
	s.pods[uid] = p
	var latest *conn
	if n := len(s.conns); n > 0 {
		latest = s.conns[n-1]
	}
	var fd int = -1
	if own != nil && latest != nil {
		// A dup per send: RemovePod may close the cached one meanwhile.
		d, err := unix.FcntlInt(own.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("cniemu: dup netns fd: %w", err)
		}
		fd = d
	}
	s.mu.Unlock()
	if own == nil {
		return nil
	}
	if latest == nil {
		return ErrNoConnection
	}
	req := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: uid, WorkloadInfo: info}}}
	resp, err := latest.send(ctx, update{msg: req, kind: inpod.KindAdd, uid: uid, fds: []int{fd}})
	if err != nil {
		return err
	}
	if e := resp.GetAck().GetError(); e != "" {
		return fmt.Errorf("cniemu: got ack error: %s", e)
	}
	return nil
}

// RemovePod drops the pod from the cache and sends DelWorkload to every
// connected ztunnel (as istio-cni: an old ztunnel still draining must hear
// about deletions too), waiting for each Ack.
func (s *Server) RemovePod(ctx context.Context, uid string) error {
	s.mu.Lock()
	if p, ok := s.pods[uid]; ok {
		if p.netns != nil {
			_ = p.netns.Close()
		}
		delete(s.pods, uid)
		for i, u := range s.order {
			if u == uid {
				s.order = append(s.order[:i], s.order[i+1:]...)
				break
			}
		}
	}
	conns := append([]*conn(nil), s.conns...)
	s.mu.Unlock()
	req := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: uid}}}
	var errs []error
	for _, c := range conns {
		resp, err := c.send(ctx, update{msg: req, kind: inpod.KindDel, uid: uid})
		if err != nil {
			errs = append(errs, err)
		} else if e := resp.GetAck().GetError(); e != "" {
			errs = append(errs, fmt.Errorf("cniemu: got ack error: %s", e))
		}
	}
	return errors.Join(errs...)
}

// SendRaw sends data as one packet, with dups of fds in SCM_RIGHTS, to the
// newest connection and returns the response. For tests of bad input.
func (s *Server) SendRaw(ctx context.Context, data []byte, fds ...int) (*zdspb.WorkloadResponse, error) {
	s.mu.Lock()
	var latest *conn
	if n := len(s.conns); n > 0 {
		latest = s.conns[n-1]
	}
	s.mu.Unlock()
	if latest == nil {
		return nil, ErrNoConnection
	}
	var own []int
	for _, fd := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeAll(own)
			return nil, fmt.Errorf("cniemu: dup fd: %w", err)
		}
		own = append(own, d)
	}
	return latest.send(ctx, update{raw: data, fds: own})
}

// Acks returns every Ack received so far, oldest first.
func (s *Server) Acks() []AckRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]AckRecord(nil), s.acks...)
}

// WaitAcks waits until at least n Acks were received and returns them.
func (s *Server) WaitAcks(ctx context.Context, n int) ([]AckRecord, error) {
	err := s.wait(ctx, func() bool { return len(s.acks) >= n })
	return s.Acks(), err
}

// WaitSnapshots waits until n snapshots (over all connections) were acked.
func (s *Server) WaitSnapshots(ctx context.Context, n int) error {
	return s.wait(ctx, func() bool { return s.snapshots >= n })
}

// Connections is the number of connected ztunnels.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// DropConnections closes every live connection (ztunnel will reconnect).
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.uc.Close()
	}
}

// wait blocks until cond (called with mu held) holds or ctx is done.
func (s *Server) wait(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cniemu: wait: %w", ctx.Err())
		}
	}
}

func (s *Server) record(r AckRecord, snapshot bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acks = append(s.acks, r)
	if snapshot {
		s.snapshots++
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) addConn(uc *net.UnixConn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nconns++
	c := &conn{id: s.nconns, uc: uc, updates: make(chan update), done: make(chan struct{})}
	s.conns = append(s.conns, c)
	return c
}

func (s *Server) delConn(c *conn) {
	_ = c.uc.Close()
	close(c.done)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.conns {
		if x == c {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			break
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func dupFile(f *os.File) (*os.File, error) {
	d, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cniemu: dup netns fd: %w", err)
	}
	return os.NewFile(uintptr(d), f.Name()), nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
