package hbone

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Socket reads and writes on the data path are made with RawSyscall, not
// through net.Conn. The descriptors are non-blocking, so the calls return
// at once, and skipping the runtime's syscall bookkeeping matters on a VM:
// the first syscall a goroutine makes after the process went idle wakes
// the runtime's sysmon thread, which then polls every 20 µs until the
// process is idle again — at 1000 requests/s that was ~1 futex wake and
// ~2.5 nanosleeps per request, each a context switch costing tens of µs
// (measured with strace -c on a ztunnel under the bench's 1000 rps phase).
// Waiting for readiness still goes through the runtime poller
// (syscall.RawConn), so deadlines and Close work as usual.

// rawRead reads from the non-blocking descriptor fd.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), 0
	}
}

// rawWrite writes to the non-blocking descriptor fd.
func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), 0
	}
}

// rawConn returns the RawConn of c when the fast paths apply to it.
func rawConn(c any) syscall.RawConn {
	if !directIO {
		return nil
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// readRaw reads into p, waiting for readability through the poller.
func readRaw(rc syscall.RawConn, p []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := rc.Read(func(fd uintptr) bool {
		n, errno = rawRead(fd, p)
		return errno != syscall.EAGAIN
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// writeRaw writes all of p, waiting for writability through the poller.
func writeRaw(rc syscall.RawConn, p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			n, e := rawWrite(fd, p[written:])
			if e == syscall.EAGAIN {
				return false
			}
			if e != 0 {
				errno = e
				return true
			}
			written += n
		}
		return true
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("write", errno)
	}
	return written, err
}

// rawNetConn is a net.Conn whose Read and Write use the raw paths; it is
// what crypto/tls reads and writes under an HBONE connection.
type rawNetConn struct {
	net.Conn
	rc syscall.RawConn
}

func newRawNetConn(c net.Conn) net.Conn {
	if rc := rawConn(c); rc != nil {
		return &rawNetConn{Conn: c, rc: rc}
	}
	return c
}

func (c *rawNetConn) Read(p []byte) (int, error) {
	n, err := readRaw(c.rc, p)
	if err != nil && err != io.EOF {
		err = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, err
}

func (c *rawNetConn) Write(p []byte) (int, error) {
	n, err := writeRaw(c.rc, p)
	if err != nil {
		err = &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, err
}
