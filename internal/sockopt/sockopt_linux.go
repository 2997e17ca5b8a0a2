package sockopt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Control is the signature of net.Dialer.Control and net.ListenConfig.Control.
type Control func(network, address string, c syscall.RawConn) error

// Mark returns a Control that sets SO_MARK to mark (no-op for mark 0).
func Mark(mark uint32) Control {
	if mark == 0 {
		return nil
	}
	return func(_, _ string, c syscall.RawConn) error {
		return setInt(c, unix.SOL_SOCKET, unix.SO_MARK, int(mark), "SO_MARK")
	}
}

// ReusePort sets SO_REUSEPORT, which lets a restarted ztunnel bind the pod's
// ports while the old process still drains on them.
func ReusePort(_, _ string, c syscall.RawConn) error {
	return setInt(c, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, "SO_REUSEPORT")
}

// Transparent sets IP_TRANSPARENT (or IPV6_TRANSPARENT), needed to accept
// connections redirected to addresses that are not the pod's own.
func Transparent(network, _ string, c syscall.RawConn) error {
	if network == "tcp6" {
		return setInt(c, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1, "IPV6_TRANSPARENT")
	}
	return setInt(c, unix.SOL_IP, unix.IP_TRANSPARENT, 1, "IP_TRANSPARENT")
}

// KeepAlive returns a Control that turns on TCP keep-alive probes after
// idle without traffic, every idle after that (the kernel's probe count
// stands). Set on a listening socket, its accepted connections inherit it.
func KeepAlive(idle time.Duration) Control {
	secs := int(idle / time.Second)
	return func(network, _ string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		if err := setInt(c, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"); err != nil {
			return err
		}
		if err := setInt(c, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs, "TCP_KEEPIDLE"); err != nil {
			return err
		}
		return setInt(c, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs, "TCP_KEEPINTVL")
	}
}

// Chain runs each non-nil Control in order and stops at the first error.
func Chain(cs ...Control) Control {
	return func(network, address string, c syscall.RawConn) error {
		for _, f := range cs {
			if f == nil {
				continue
			}
			if err := f(network, address, c); err != nil {
				return err
			}
		}
		return nil
	}
}

func setInt(c syscall.RawConn, level, opt, value int, name string) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), level, opt, value)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("sockopt: set %s: %w", name, err)
	}
	return nil
}

// ErrNoOriginalDst means the connection was not redirected by netfilter.
var ErrNoOriginalDst = errors.New("sockopt: no original destination")

// OriginalDst returns the destination a REDIRECTed TCP connection was sent to
// before netfilter rewrote it. It tries the IPv4 option first, then IPv6.
func OriginalDst(conn *net.TCPConn) (netip.AddrPort, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("sockopt: original dst: %w", err)
	}
	var out netip.AddrPort
	var serr error
	cerr := raw.Control(func(fd uintptr) {
		out, serr = originalDst(int(fd))
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("sockopt: original dst: %w", cerr)
	}
	return out, serr
}

func originalDst(fd int) (netip.AddrPort, error) {
	// SO_ORIGINAL_DST returns a sockaddr_in; x/sys exposes it through the
	// IPv6 mreq getter, which has the right size (16 bytes).
	if mreq, err := unix.GetsockoptIPv6Mreq(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST); err == nil {
		b := mreq.Multiaddr
		port := binary.BigEndian.Uint16(b[2:4])
		addr := netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]})
		return netip.AddrPortFrom(addr, port), nil
	}
	// IP6T_SO_ORIGINAL_DST has the same value (80) at the IPv6 level and
	// returns a sockaddr_in6.
	info, err := unix.GetsockoptIPv6MTUInfo(fd, unix.SOL_IPV6, unix.SO_ORIGINAL_DST)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %v", ErrNoOriginalDst, err)
	}
	port := ntohs(info.Addr.Port)
	addr := netip.AddrFrom16(info.Addr.Addr).Unmap()
	return netip.AddrPortFrom(addr, port), nil
}

// ntohs converts the raw network-order port of a sockaddr to host order.
func ntohs(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}
