package proxy

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// spliceCopy copies src → dst, two TCP sockets, in the kernel with
// splice(2), like (*net.TCPConn).ReadFrom, with one difference that
// matters for a proxy holding many idle connections: the runtime's splice
// keeps a pipe (two descriptors, and the pipe's pages once used) for the
// whole life of the copy, so an idle passthrough connection held six
// descriptors. Here a pipe is borrowed from a small free list only while
// bytes move and returned as soon as the source has nothing more to read:
// an idle connection holds its two sockets and nothing else. Bytes are
// counted into n as they move, so live metrics see them too.
func spliceCopy(dst, src *net.TCPConn, n *atomic.Int64) error {
	sc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	dc, err := dst.SyscallConn()
	if err != nil {
		return err
	}
	sp := &splicer{}
	sp.readFn, sp.writeFn = sp.fill, sp.drain
	for {
		// Fill the pipe from src, waiting for readability with no pipe held.
		sp.errno = 0
		if err := sc.Read(sp.readFn); err != nil {
			sp.release()
			return err
		}
		if sp.errno != 0 {
			sp.release()
			return os.NewSyscallError("splice", sp.errno)
		}
		if sp.inPipe == 0 {
			sp.release()
			return nil // EOF
		}
		// Drain it into dst, waiting for writability as needed.
		moved := sp.inPipe
		if err := dc.Write(sp.writeFn); err != nil {
			sp.release()
			return err
		}
		if sp.errno != 0 {
			sp.release()
			return os.NewSyscallError("splice", sp.errno)
		}
		n.Add(int64(moved))
	}
}

// splicer holds one copy's pipe and the splice callbacks' state; the
// callbacks are bound once so a splice allocates nothing.
type splicer struct {
	p       *kpipe // nil while idle
	inPipe  int    // bytes in the pipe
	errno   syscall.Errno
	readFn  func(uintptr) bool
	writeFn func(uintptr) bool
}

// spliceChunk is how much one splice moves at most: a default pipe's
// capacity.
const spliceChunk = 64 << 10

// fill moves what src has into the pipe. It takes a pipe only when src
// turns out to have bytes, and gives it back when it has none.
func (s *splicer) fill(fd uintptr) bool {
	if s.p == nil {
		p, err := getPipe()
		if err != nil {
			s.errno = err.(syscall.Errno)
			return true
		}
		s.p = p
	}
	n, err := rawSplice(int(fd), s.p.w, spliceChunk)
	switch {
	case err == syscall.EINTR:
		return s.fill(fd)
	case err == syscall.EAGAIN:
		s.release()
		return false // wait for the poller, without a pipe
	case err != nil:
		s.errno = err.(syscall.Errno)
	default:
		s.inPipe = int(n)
	}
	return true
}

// drain moves the pipe's bytes into dst.
func (s *splicer) drain(fd uintptr) bool {
	for s.inPipe > 0 {
		n, err := rawSplice(s.p.r, int(fd), s.inPipe)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false // dst is full: wait
		case err != nil:
			s.errno = err.(syscall.Errno)
			return true
		}
		s.inPipe -= int(n)
	}
	return true
}

// rawSplice moves up to n bytes from in to out without blocking. It is a
// RawSyscall, like hbone's socket I/O: a non-blocking call needs none of
// the runtime's syscall bookkeeping, whose first use after the process
// went idle wakes the sysmon thread (a context switch per request).
func rawSplice(in, out, n int) (int, error) {
	r, _, e := syscall.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// release returns the pipe; one that still holds bytes (an error cut the
// copy short) is closed rather than reused.
func (s *splicer) release() {
	if s.p == nil {
		return
	}
	if s.inPipe > 0 {
		s.p.close()
	} else {
		putPipe(s.p)
	}
	s.p, s.inPipe = nil, 0
}

// kpipe is a kernel pipe: read and write ends.
type kpipe struct{ r, w int }

func (p *kpipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// freePipes keeps a few empty pipes for reuse; the number of pipes in use
// at once is the number of connections moving bytes at that moment.
var freePipes = make(chan *kpipe, 64)

func getPipe() (*kpipe, error) {
	select {
	case p := <-freePipes:
		return p, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, errno
		}
		return nil, syscall.EMFILE
	}
	return &kpipe{r: fds[0], w: fds[1]}, nil
}

func putPipe(p *kpipe) {
	select {
	case freePipes <- p:
	default:
		p.close()
	}
}
