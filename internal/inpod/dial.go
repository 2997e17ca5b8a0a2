package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/sockopt"
)

// dialLiteral dials ip:port from inside n without holding the namespace
// thread for the connect: only socket(2) runs on it (a socket belongs to
// the namespace it was created in, for life); options, bind and the
// non-blocking connect run on the caller's goroutine, and the wait goes
// through the runtime poller like any dial. Measured with
// BenchmarkNetnsDial: the whole dial on the namespace thread made every
// connect's completion a hand-off to that locked thread.
func (n *Netns) dialLiteral(ctx context.Context, raddr netip.AddrPort, local *net.TCPAddr, ctrl sockopt.Control) (net.Conn, error) {
	family, rsa := sockaddr(raddr)
	var fd int
	err := n.Do(func() (err error) {
		fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	owned := true
	defer func() {
		if owned {
			unix.Close(fd)
		}
	}()
	// Controls get the resolved network, as from net.Dialer.
	resolved := "tcp4"
	if family == unix.AF_INET6 {
		resolved = "tcp6"
	}
	if err := ctrl(resolved, raddr.String(), fdRawConn(fd)); err != nil {
		return nil, err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return nil, fmt.Errorf("TCP_NODELAY: %w", err)
	}
	if local != nil {
		la, ok := netip.AddrFromSlice(local.IP)
		if !ok {
			return nil, fmt.Errorf("bad local address %v", local)
		}
		_, lsa := sockaddr(netip.AddrPortFrom(la.Unmap(), uint16(local.Port)))
		if family == unix.AF_INET6 && la.Is4() {
			_, lsa = sockaddr(netip.AddrPortFrom(netip.AddrFrom16(la.As16()), uint16(local.Port)))
		}
		if err := unix.Bind(fd, lsa); err != nil {
			return nil, fmt.Errorf("bind %v: %w", local, err)
		}
	}
	if err := unix.Connect(fd, rsa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return nil, fmt.Errorf("connect: %w", err)
	}
	f := os.NewFile(uintptr(fd), "")
	owned = false
	c, err := net.FileConn(f) // registers a duplicate with the poller
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := awaitConnect(ctx, c); err != nil {
		c.Close()
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		// What net.Dialer sets by default.
		_ = tc.SetKeepAlive(true)
		_ = tc.SetKeepAlivePeriod(15 * time.Second)
	}
	return c, nil
}

// awaitConnect waits until the non-blocking connect of c finished, within
// ctx, and returns its result.
func awaitConnect(ctx context.Context, c net.Conn) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
		defer c.SetWriteDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			cerr = err
			return true
		case v != 0:
			cerr = syscall.Errno(v)
			return true
		}
		if _, err := unix.Getpeername(int(fd)); err != nil {
			return false // still connecting: wait for writability
		}
		return true
	})
	if werr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return werr
	}
	if cerr != nil {
		return fmt.Errorf("connect: %w", cerr)
	}
	return nil
}

func sockaddr(ap netip.AddrPort) (int, unix.Sockaddr) {
	if a := ap.Addr(); a.Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// fdRawConn is a syscall.RawConn for a descriptor not yet handed to the
// runtime, so sockopt.Control functions can set options on it.
type fdRawConn int

func (fd fdRawConn) Control(f func(uintptr)) error { f(uintptr(fd)); return nil }
func (fd fdRawConn) Read(func(uintptr) bool) error {
	return errors.New("inpod: raw fd: read not supported")
}
func (fd fdRawConn) Write(func(uintptr) bool) error {
	return errors.New("inpod: raw fd: write not supported")
}
