package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/sockopt"
)

// NetnsID identifies a network namespace: two FDs name the same namespace
// exactly when their nsfs device and inode match (what upstream, cilium and
// vishvananda/netns compare).
type NetnsID struct {
	Dev   uint64
	Inode uint64
}

func (id NetnsID) String() string { return fmt.Sprintf("net:[%d] dev %d", id.Inode, id.Dev) }

// NetnsOptions are applied to every listener a Netns makes.
type NetnsOptions struct {
	// Mark is SO_MARK on listeners (PACKET_MARK; upstream's in-pod default is
	// 1337 = 0x539, the mark the pod's iptables rules let through). 0: none.
	Mark uint32
	// ReusePort sets SO_REUSEPORT on listeners (INPOD_PORT_REUSE, upstream
	// default true) so a new ztunnel can bind a pod's ports while the old one
	// still drains on them. With it, the first TCP Listen also sets the
	// namespace's net.ipv4.tcp_migrate_req to 1 (best effort; Linux 5.14+):
	// when the draining ztunnel closes its listener, connections already in
	// that listener's accept queue move to the new ztunnel's listener
	// instead of being reset (see docs/reliability.md, restart with handoff).
	ReusePort bool
}

// migrateReqPath is the per-namespace sysctl; /proc/sys/net resolves to the
// namespace of the thread that opens it.
const migrateReqPath = "/proc/sys/net/ipv4/tcp_migrate_req"

// ErrNetnsClosed is returned by a Netns used after Close.
var ErrNetnsClosed = errors.New("inpod: netns closed")

// Netns is a pod's network namespace, held open by an FD, and the socket
// factory for it: sockets are created on an OS thread that has joined the
// namespace, and keep belonging to it wherever they are used afterwards.
type Netns struct {
	// immutable after construction
	id   NetnsID
	opts NetnsOptions

	mu sync.RWMutex // read-held while an FD is passed to setns; write-held by Close
	fd int          // guarded by mu; -1 once closed

	migrateOnce sync.Once // tcp_migrate_req set (ReusePort)
}

// NewNetns takes ownership of fd, checks that it is a network namespace and
// returns it as a Netns. On error fd is closed.
func NewNetns(fd int, opts NetnsOptions) (*Netns, error) {
	id, err := checkNetns(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return &Netns{id: id, opts: opts, fd: fd}, nil
}

// OpenNetns opens a namespace by path (/var/run/netns/NAME, /proc/PID/ns/net).
func OpenNetns(path string, opts NetnsOptions) (*Netns, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("inpod: open netns %s: %w", path, err)
	}
	return NewNetns(fd, opts)
}

// checkNetns returns fd's identity if it is a network namespace. The
// NS_GET_NSTYPE ioctl answers exactly; kernels before 4.11 lack it, and then
// the FD must at least live on nsfs (or procfs, for old /proc/PID/ns links).
func checkNetns(fd int) (NetnsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return NetnsID{}, fmt.Errorf("inpod: netns fd %d: fstat: %w", fd, err)
	}
	nstype, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	switch {
	case err == nil && nstype != unix.CLONE_NEWNET:
		return NetnsID{}, fmt.Errorf("inpod: fd %d is a namespace of type %#x, not a network namespace", fd, nstype)
	case err != nil:
		var fs unix.Statfs_t
		if serr := unix.Fstatfs(fd, &fs); serr != nil {
			return NetnsID{}, fmt.Errorf("inpod: netns fd %d: fstatfs: %w", fd, serr)
		}
		if fs.Type != unix.NSFS_MAGIC && fs.Type != unix.PROC_SUPER_MAGIC {
			return NetnsID{}, fmt.Errorf("inpod: fd %d is not a network namespace (filesystem %#x, ioctl: %v)", fd, fs.Type, err)
		}
	}
	return NetnsID{Dev: uint64(st.Dev), Inode: st.Ino}, nil
}

// ID identifies the namespace.
func (n *Netns) ID() NetnsID { return n.id }

// Close releases the namespace FD. Sockets made inside keep working. Safe to
// call twice.
func (n *Netns) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fd < 0 {
		return nil
	}
	err := unix.Close(n.fd)
	n.fd = -1
	if err != nil {
		return fmt.Errorf("inpod: close netns: %w", err)
	}
	return nil
}

// enter moves the calling (locked) thread into n. It first makes sure the
// way back is known (hostNetns), while the thread is still at home.
func (n *Netns) enter() error {
	if _, err := hostNetns(); err != nil {
		return err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.fd < 0 {
		return ErrNetnsClosed
	}
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("inpod: enter netns %s: %w", n.id, err)
	}
	return nil
}

// Do runs fn on an OS thread inside n and returns its error. Sockets fn
// creates belong to n; goroutines fn starts do not run inside n, but child
// processes fn starts do. fn runs on a fresh goroutine: if the thread cannot
// be switched back, that goroutine exits still locked, and the runtime
// destroys the thread instead of reusing it in the wrong namespace.
func (n *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := n.enter(); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := leave(); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("inpod: from netns %s: %w", n.id, err))
			return // still locked: the thread dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// hostNetns is an FD of the namespace every unlocked thread is in: no
// thread is unlocked while inside a pod (Do, dialLiteral). Opened once, it
// saves each namespace switch the four syscalls of finding out where to
// return.
var hostNetns = sync.OnceValues(func() (int, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("inpod: open own netns: %w", err)
	}
	return fd, nil
})

// leave moves the calling (locked) thread back to the host namespace. On
// error the thread must never be unlocked.
func leave() error {
	fd, err := hostNetns()
	if err != nil {
		return err
	}
	return unix.Setns(fd, unix.CLONE_NEWNET)
}

// ListenOption adjusts one listener.
type ListenOption func(*listenConfig)

type listenConfig struct {
	transparent, transparentRequired bool
}

// ListenTransparent sets IP_TRANSPARENT (IPV6_TRANSPARENT) on the listener,
// which ztunnel needs to keep clients' original source addresses. Upstream
// tries it on its listeners and goes on without it unless original source
// is explicitly required; required=false does the same.
func ListenTransparent(required bool) ListenOption {
	return func(c *listenConfig) { c.transparent, c.transparentRequired = true, required }
}

func (n *Netns) listenControl(opts []ListenOption) sockopt.Control {
	var lc listenConfig
	for _, o := range opts {
		o(&lc)
	}
	cs := []sockopt.Control{sockopt.Mark(n.opts.Mark), sockopt.KeepAlive(keepAliveIdle)}
	if n.opts.ReusePort {
		cs = append(cs, sockopt.ReusePort)
	}
	if lc.transparent {
		t := sockopt.Control(sockopt.Transparent)
		if !lc.transparentRequired {
			t = bestEffort(t)
		}
		cs = append(cs, t)
	}
	return sockopt.Chain(cs...)
}

func bestEffort(c sockopt.Control) sockopt.Control {
	return func(network, address string, rc syscall.RawConn) error {
		_ = c(network, address, rc)
		return nil
	}
}

// Listen opens a stream listener inside n (network "tcp", "tcp4", "tcp6"),
// with the Netns options applied. Ports ztunnel uses: 15001 outbound, 15006
// inbound plaintext, 15008 inbound HBONE, 15053 DNS (also over UDP).
//
// Accepted connections get keep-alive probes after keepAliveIdle as with
// net.ListenConfig's default, but inherited from the listening socket:
// the default sets them with four setsockopt calls on every accepted
// connection.
func (n *Netns) Listen(network, addr string, opts ...ListenOption) (net.Listener, error) {
	lc := net.ListenConfig{Control: n.listenControl(opts), KeepAlive: -1}
	var ln net.Listener
	err := n.Do(func() (err error) {
		if n.opts.ReusePort {
			n.migrateOnce.Do(enableMigrateReq)
		}
		ln, err = lc.Listen(context.Background(), network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("inpod: listen %s %s in %s: %w", network, addr, n.id, err)
	}
	return ln, nil
}

// enableMigrateReq sets tcp_migrate_req in the calling thread's namespace.
// Errors are ignored: older kernels lack the sysctl, and without it a
// handoff can reset the few connections queued at the moment of close.
func enableMigrateReq() {
	f, err := os.OpenFile(migrateReqPath, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	_, _ = f.WriteString("1")
	_ = f.Close()
}

// ListenPacket opens a datagram socket inside n (for the DNS proxy).
func (n *Netns) ListenPacket(network, addr string, opts ...ListenOption) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: n.listenControl(opts)}
	var pc net.PacketConn
	err := n.Do(func() (err error) {
		pc, err = lc.ListenPacket(context.Background(), network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("inpod: listen %s %s in %s: %w", network, addr, n.id, err)
	}
	return pc, nil
}

// keepAliveIdle is the keep-alive idle time and probe interval of every
// TCP connection made in a pod (net.Dialer's and net.ListenConfig's
// default; the kernel's probe count stands).
const keepAliveIdle = 15 * time.Second

// DialOption adjusts one outgoing connection.
type DialOption func(*net.Dialer, *[]sockopt.Control)

// DialFrom binds the connection to src (usually not an address of the pod)
// with IP_TRANSPARENT, so the peer sees the original client address. Used
// for inbound connections to the app.
func DialFrom(src netip.Addr) DialOption {
	return func(d *net.Dialer, cs *[]sockopt.Control) {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice(), Zone: src.Zone()}
		*cs = append(*cs, sockopt.Transparent)
	}
}

// Dial connects from inside n, with SO_MARK mark (0: none) so the pod's
// redirect rules let the connection out instead of capturing it again. A
// literal ip:port (every dial ztunnel makes) creates its socket with the
// calling goroutine's thread in the namespace and connects outside it
// (dial.go; if that thread cannot return, the error says "stranded" and
// the goroutine should end); anything else runs the whole dial in Do. The
// caller must not be locked to its thread (runtime.LockOSThread): the
// thread would be returned to ztunnel's namespace, not to the one it was
// in.
func (n *Netns) Dial(ctx context.Context, network, addr string, mark uint32, opts ...DialOption) (net.Conn, error) {
	// KeepAlive as net.Dialer's default would set it, less the probe count
	// (one setsockopt fewer; the kernel's default stands).
	d := net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveIdle, Count: -1}}
	cs := []sockopt.Control{sockopt.Mark(mark)}
	for _, o := range opts {
		o(&d, &cs)
	}
	d.Control = sockopt.Chain(cs...)
	var c net.Conn
	var err error
	if ap, perr := netip.ParseAddrPort(addr); perr == nil && (network == "tcp" || network == "tcp4" || network == "tcp6") {
		c, err = n.dialLiteral(ctx, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), &d)
	} else {
		err = n.Do(func() (err error) {
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("inpod: dial %s %s from %s: %w", network, addr, n.id, err)
	}
	return c, nil
}
