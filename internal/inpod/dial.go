package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// dialLiteral dials ip:port from inside n with d, on the calling
// goroutine, holding its thread in the namespace only until the socket
// exists (a socket belongs to the namespace it was created in, for life):
// d's Control hook, which runs after socket(2), switches the thread back
// and unlocks it, then binds and starts the connect (startConnect), so a
// connect that must wait does so through the runtime poller like any
// dial. Measured with
// BenchmarkNetnsDial: the whole dial on the namespace thread made every
// connect's completion a hand-off to that locked thread; the socket made
// in Do and adopted with net.FileConn cost seven syscalls more (dup,
// fcntl, SO_TYPE, ...); and Do's fresh goroutine a hand-off each way
// (145-154 → 104-109 µs per dial+accept+close, 1.1-1.2 → 0.8 context
// switches); the connect started in the hook, 71 → 63-67 µs.
//
// The price of the calling goroutine: if its thread could not return to
// ztunnel's namespace (setns with an FD held open since start-up; never
// seen) the dial fails with errStranded and the goroutine stays locked,
// so the runtime destroys the thread when the goroutine ends instead of
// reusing it in the pod's namespace. Until then its own further dials
// fail the same way (see Dial).
func (n *Netns) dialLiteral(ctx context.Context, raddr netip.AddrPort, d *net.Dialer) (net.Conn, error) {
	runtime.LockOSThread()
	if err := n.enter(); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	inside := true
	ctrl := d.Control
	dd := *d
	// The hook binds and connects itself, so the dialer must not bind again.
	dd.LocalAddr = nil
	// A literal address is one address: one socket, one Control call, so
	// no second socket can be made after the thread left the namespace.
	dd.Control = func(network, address string, c syscall.RawConn) error {
		if err := leave(); err != nil {
			return fmt.Errorf("%w: from netns %s: %w", errStranded, n.id, err)
		}
		inside = false
		runtime.UnlockOSThread()
		if ctrl != nil {
			if err := ctrl(network, address, c); err != nil {
				return err
			}
		}
		return startConnect(network, c, d.LocalAddr, raddr)
	}
	c, err := dd.DialContext(ctx, "tcp", raddr.String())
	if inside {
		if lerr := leave(); lerr != nil {
			return nil, errors.Join(err, fmt.Errorf("%w: from netns %s: %w", errStranded, n.id, lerr))
		}
		runtime.UnlockOSThread()
	}
	return c, err
}

// startConnect binds the socket to laddr (if set) and starts the
// connect to raddr before the dialer's own connect(2), which then finds
// the handshake done: a peer inside the node (a pod behind a veth)
// answers the SYN in the softirq of the connect call itself, and the
// kernel completes the handshake as the call releases the socket. The
// dialer's connect then returns 0 at once, where alone it gets
// EINPROGRESS and parks the goroutine in the poller until the socket is
// writable, then asks SO_ERROR and the peer's address: one park and
// wake-up, a deadline timer and two syscalls fewer per connection. A
// peer that has not answered yet leaves the dialer's connect with
// EALREADY, which it waits out as before; a refusal reaches it as
// ECONNREFUSED.
//
// The dialer binds after Control, too late for a connect made here, so
// laddr is bound here.
func startConnect(network string, c syscall.RawConn, laddr net.Addr, raddr netip.AddrPort) error {
	rsa, ok := sockaddr(network, raddr)
	if !ok {
		return fmt.Errorf("connect %s: address does not fit a %s socket", raddr, network)
	}
	var lsa unix.Sockaddr
	if laddr != nil {
		la, ok := laddr.(*net.TCPAddr)
		if !ok {
			return fmt.Errorf("bind: local address %v is not TCP", laddr)
		}
		lap := la.AddrPort()
		if lsa, ok = sockaddr(network, netip.AddrPortFrom(lap.Addr().Unmap(), lap.Port())); !ok {
			return fmt.Errorf("bind %s: address does not fit a %s socket", lap, network)
		}
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		if lsa != nil {
			// Leave the port to connect(2), which picks one free for this
			// source, destination and destination port. bind(2) alone must
			// pick a port free for the source address towards every
			// destination, TIME_WAIT sockets included: the receiving
			// ztunnel closes first, so each inbound connection leaves one,
			// and with a client's address as the source the search grew
			// with every connection of the last minute (bind was 67 % of
			// the receiving ztunnel's CPU after the bench's connection
			// loops). Kernels before 4.2 lack the option: bind as before.
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			if err := unix.Bind(int(fd), lsa); err != nil {
				serr = os.NewSyscallError("bind", err)
				return
			}
		}
		switch err := unix.Connect(int(fd), rsa); err {
		case nil, unix.EINPROGRESS, unix.EINTR:
		default:
			serr = os.NewSyscallError("connect", err)
		}
	})
	return errors.Join(err, serr)
}

// sockaddr converts a to the socket address of a network ("tcp4" or
// "tcp6", as the dialer names its socket's family).
func sockaddr(network string, a netip.AddrPort) (unix.Sockaddr, bool) {
	ip := a.Addr()
	switch {
	case network == "tcp4" && ip.Is4():
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: ip.As4()}, true
	case network == "tcp6" && ip.Zone() == "":
		return &unix.SockaddrInet6{Port: int(a.Port()), Addr: ip.As16()}, true
	}
	return nil, false
}

// errStranded: a thread could not leave a pod's namespace.
var errStranded = errors.New("thread stranded in the pod's namespace")
