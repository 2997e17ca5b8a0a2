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
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) { return rawIOCall(syscall.SYS_READ, fd, p) }

// rawWrite writes to the non-blocking descriptor fd.
func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) { return rawIOCall(syscall.SYS_WRITE, fd, p) }

// rawIOCall makes the read or write syscall trap on fd, retrying EINTR.
func rawIOCall(trap, fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	for {
		n, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
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

// rawIO reads and writes one descriptor through the poller without
// allocating: the callbacks handed to syscall.RawConn are bound once, and
// their arguments and results travel in the struct, because a closure
// capturing locals would escape to the heap on every call. Reads and
// writes may run concurrently with each other, but not with themselves.
type rawIO struct {
	rc syscall.RawConn

	rbuf   []byte
	rn     int
	rerrno syscall.Errno
	readFn func(uintptr) bool

	wbuf    []byte
	wn      int
	werrno  syscall.Errno
	wait    bool // block until all is written; false: stop at EAGAIN
	writeFn func(uintptr) bool

	room   bool // roomNow's result
	pollFn func(uintptr)
}

func newRawIO(rc syscall.RawConn) *rawIO {
	r := &rawIO{rc: rc}
	r.readFn = r.doRead
	r.writeFn = r.doWrite
	r.pollFn = r.doPoll
	return r
}

// pollFd is struct pollfd.
type pollFd struct {
	fd             int32
	events, revent int16
}

const pollOut = 0x4 // POLLOUT

var zeroTimeout syscall.Timespec

// doPoll asks the kernel, without waiting, whether fd is writable: for
// TCP, at least a third of the send buffer free (and the unsent bytes
// below TCP_NOTSENT_LOWAT when that is set).
func (r *rawIO) doPoll(fd uintptr) {
	p := pollFd{fd: int32(fd), events: pollOut}
	n, _, e := syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1, uintptr(unsafe.Pointer(&zeroTimeout)), 0, 0, 0)
	r.room = e == 0 && n == 1 && p.revent&pollOut != 0
}

// roomNow reports whether a small write would be taken at once. It may
// run concurrently with read and write, not with itself (the connection
// calls it under its write lock).
func (r *rawIO) roomNow() bool {
	r.room = false
	if r.rc.Control(r.pollFn) != nil {
		return false
	}
	return r.room
}

func (r *rawIO) doRead(fd uintptr) bool {
	r.rn, r.rerrno = rawRead(fd, r.rbuf)
	return r.rerrno != syscall.EAGAIN
}

func (r *rawIO) doWrite(fd uintptr) bool {
	for r.wn < len(r.wbuf) {
		n, e := rawWrite(fd, r.wbuf[r.wn:])
		if e == syscall.EAGAIN {
			return !r.wait
		}
		if e != 0 {
			r.werrno = e
			return true
		}
		r.wn += n
	}
	return true
}

// read reads into p, waiting for readability through the poller.
func (r *rawIO) read(p []byte) (int, error) {
	r.rbuf, r.rn, r.rerrno = p, 0, 0
	err := r.rc.Read(r.readFn)
	r.rbuf = nil
	switch {
	case err != nil:
		return 0, err
	case r.rerrno != 0:
		return 0, os.NewSyscallError("read", r.rerrno)
	case r.rn == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return r.rn, nil
}

// write writes p; with wait it waits for writability until all is
// written, without it returns what the socket took at once.
func (r *rawIO) write(p []byte, wait bool) (int, error) {
	r.wbuf, r.wn, r.werrno, r.wait = p, 0, 0, wait
	err := r.rc.Write(r.writeFn)
	r.wbuf = nil
	if err == nil && r.werrno != 0 {
		err = os.NewSyscallError("write", r.werrno)
	}
	return r.wn, err
}

// rawNetConn is a net.Conn whose Read and Write use the raw paths; it is
// what crypto/tls reads and writes under an HBONE connection.
type rawNetConn struct {
	net.Conn
	io *rawIO
}

func newRawNetConn(c net.Conn) net.Conn {
	if rc := rawConn(c); rc != nil {
		return &rawNetConn{Conn: c, io: newRawIO(rc)}
	}
	return c
}

func (c *rawNetConn) Read(p []byte) (int, error) {
	n, err := c.io.read(p)
	if err != nil && err != io.EOF {
		err = opError("read", c, err)
	}
	return n, err
}

func (c *rawNetConn) Write(p []byte) (int, error) {
	n, err := c.io.write(p, true)
	if err != nil {
		err = opError("write", c, err)
	}
	return n, err
}

// opError wraps err from a raw read or write on c as net.TCPConn's
// methods report it.
func opError(op string, c net.Conn, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
