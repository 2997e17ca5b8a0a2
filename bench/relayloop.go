package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// relayBufSize is what one read may take: what ztunnel reads from a pod's
// socket at a time for a peer ztunnel (256 KiB frames), so bulk streams
// make as many reads.
const relayBufSize = 256 << 10

// relayEnd is one socket of a relayed connection. Bytes read from an end
// are written to its peer; what the peer's socket does not take at once
// waits in the peer's out, and the end is not read again until it is
// gone (level-triggered epoll reports it again then).
type relayEnd struct {
	fd   int
	peer *relayEnd
	// listener: a listening socket; target is where its connections go.
	// sealAccepted, sealDialed: the accepted or the dialled sockets carry
	// sealed records (relayseal.go).
	// targetMSS, if set, is the TCP_MAXSEG of the dialled sockets.
	listener                 bool
	target                   unix.SockaddrInet4
	sealAccepted, sealDialed bool
	targetMSS                int
	// seal: this socket carries sealed records; nil: plain bytes.
	seal *sealer
	// connecting: the dial to the target has not completed.
	connecting bool
	eof        bool   // the socket's reader saw end of stream
	out        []byte // bytes for this socket the kernel has not taken
	outBuf     []byte // out's array, kept for the next time
	shutWrite  bool   // peer reached EOF: shut this socket's write side once out is empty
	registered bool   // with epoll
	events     uint32 // the interest registered
	closed     bool
}

// relayThreadName is the relay loop thread's name (comm), NUL-terminated.
var relayThreadName = []byte("bench-relay\x00")

// relayLoop is a relay's whole state: one thread runs it.
type relayLoop struct {
	ep      int
	stdinFD int
	ends    map[int]*relayEnd
	buf     []byte
	sbuf    []byte // records sealed from buf
	evs     [128]unix.EpollEvent
}

// relayModeEnv, set to relayModeGoroutines in the harness's environment
// (the relays inherit it), runs the relays on Go's poller (relaygo.go).
const (
	relayModeEnv        = "BENCH_RELAY_MODE"
	relayModeGoroutines = "goroutines"
)

// relayMain runs a relay until its stdin reaches EOF. Each argument is a
// relayArg ("listen>target"). It is started inside a pod's network
// namespace (startRelay), so its sockets are the pod's.
func relayMain(args []string, stdin *os.File, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("relay: no listen>target pairs")
	}
	if os.Getenv(relayModeEnv) == relayModeGoroutines {
		return relayGoroutines(args, stdin, stdout)
	}
	// The loop waits in epoll_wait without telling the runtime (a raw
	// system call), so it must have its thread to itself.
	runtime.LockOSThread()
	// Unlocked on return so that a test calling relayMain in its own
	// process does not end the thread (and drop its CPU time from the
	// live threads TestThreadsCPU sums) when the test's goroutine ends.
	defer runtime.UnlockOSThread()
	// Named so that perf and top tell the relay's loop from the harness
	// (both are this binary).
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&relayThreadName[0])), 0, 0, 0)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("relay: epoll_create1: %w", err)
	}
	defer unix.Close(ep)
	l := &relayLoop{ep: ep, stdinFD: int(stdin.Fd()), ends: map[int]*relayEnd{}, buf: make([]byte, relayBufSize), sbuf: make([]byte, 0, sealedSize(relayBufSize))}
	defer l.closeAll()
	for _, a := range args {
		ra, err := parseRelayArg(a)
		if err != nil {
			return err
		}
		if err := l.listen(ra); err != nil {
			return err
		}
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, l.stdinFD, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.stdinFD)}); err != nil {
		return fmt.Errorf("relay: watch stdin: %w", err)
	}
	if _, err := fmt.Fprintln(stdout, relayReady); err != nil {
		return fmt.Errorf("relay: report ready: %w", err)
	}
	return l.run()
}

func (l *relayLoop) listen(ra relayArg) error {
	la, ta := ra.listen, ra.target
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("relay: socket: %w", err)
	}
	e := &relayEnd{fd: fd, listener: true, target: unix.SockaddrInet4{Port: int(ta.Port()), Addr: ta.Addr().As4()},
		sealAccepted: ra.sealListen, sealDialed: ra.sealTarget, targetMSS: ra.targetMSS}
	l.ends[fd] = e
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fmt.Errorf("relay: SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return fmt.Errorf("relay: bind %s: %w", la, err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return fmt.Errorf("relay: listen %s: %w", la, err)
	}
	return l.watch(e, unix.EPOLLIN)
}

// run serves events until stdin closes.
func (l *relayLoop) run() error {
	for {
		n, errno := rawEpollWait(l.ep, l.evs[:])
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("relay: epoll_wait: %w", errno)
		}
		for _, ev := range l.evs[:n] {
			fd := int(ev.Fd)
			if fd == l.stdinFD {
				if k, _ := rawRead(fd, l.buf); k <= 0 {
					return nil // EOF (or a broken pipe): the parent is done
				}
				continue
			}
			e := l.ends[fd]
			if e == nil || e.closed {
				continue
			}
			if e.listener {
				l.accept(e)
				continue
			}
			l.serve(e, ev.Events)
		}
	}
}

// accept takes every pending connection and starts its dial.
func (l *relayLoop) accept(ln *relayEnd) {
	for {
		fd, _, errno := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(ln.fd), 0, 0, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		if errno != 0 {
			return // EAGAIN, or an aborted connection: nothing to serve
		}
		down := &relayEnd{fd: int(fd)}
		l.ends[down.fd] = down
		ufd, _, errno := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if errno != 0 {
			l.close(down)
			continue
		}
		up := &relayEnd{fd: int(ufd), peer: down, connecting: true}
		down.peer = up
		l.ends[up.fd] = up
		if !l.startSealing(ln, down, up) {
			l.close(down)
			continue
		}
		setNoDelay(down.fd)
		setNoDelay(up.fd)
		if ln.targetMSS > 0 && setMSS(up.fd, ln.targetMSS) != nil {
			l.close(down)
			continue
		}
		sa := rawSockaddr(ln.target)
		_, _, errno = unix.RawSyscall(unix.SYS_CONNECT, ufd, uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
		if errno != 0 && errno != unix.EINPROGRESS {
			l.close(down)
			continue
		}
		l.update(down)
		l.update(up)
	}
}

// serve handles what epoll reported on e.
func (l *relayLoop) serve(e *relayEnd, events uint32) {
	if events&unix.EPOLLERR != 0 && !e.connecting {
		l.close(e) // reset: the other end sees its socket closed
		return
	}
	if events&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 && (e.connecting || len(e.out) > 0) {
		if e.connecting {
			if soErr, err := unix.GetsockoptInt(e.fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soErr != 0 {
				l.close(e)
				return
			}
			e.connecting = false
		}
		if !l.flush(e) {
			return
		}
	}
	if events&(unix.EPOLLIN|unix.EPOLLERR|unix.EPOLLHUP) != 0 && e.readable() {
		n, errno, data := l.read(e)
		switch {
		case n > 0 && data == nil:
			l.close(e) // a record that does not open
			return
		case n > 0:
			// Straight from the read buffer; only what the peer's socket
			// does not take is copied to wait.
			p := e.peer
			if p.seal != nil {
				data = p.seal.seal(l.sbuf[:0], data)
			}
			if !p.connecting && len(data) > 0 {
				w, errno := rawWrite(p.fd, data)
				if errno != 0 && errno != unix.EAGAIN {
					l.close(e)
					return
				}
				data = data[w:]
			}
			if len(data) > 0 {
				p.out = append(p.outBuf[:0], data...)
				p.outBuf = p.out[:0]
			}
		case n == 0:
			e.eof = true
			e.peer.shutWrite = true
			if !e.peer.connecting && !l.flush(e.peer) {
				return
			}
		case errno != unix.EAGAIN:
			l.close(e)
			return
		}
	}
	if e.eof && e.peer.eof && len(e.out) == 0 && len(e.peer.out) == 0 {
		l.close(e)
		return
	}
	l.update(e)
	l.update(e.peer)
}

// read reads from e into the loop's buffer. It returns the read's count
// and errno, and the bytes for e's peer: what was read, or from a sealed
// socket the plaintext of the records completed (empty while a record is
// incomplete, nil if one does not open).
func (l *relayLoop) read(e *relayEnd) (int, syscall.Errno, []byte) {
	if e.seal == nil {
		n, errno := rawRead(e.fd, l.buf)
		if n <= 0 {
			return n, errno, nil
		}
		return n, errno, l.buf[:n]
	}
	k := copy(l.buf, e.seal.in)
	n, errno := rawRead(e.fd, l.buf[k:])
	if n <= 0 {
		return n, errno, nil
	}
	plain, rest, err := e.seal.open(l.buf[:k+n])
	if err != nil {
		return n, 0, nil
	}
	e.seal.in = append(e.seal.in[:0], rest...)
	return n, 0, plain
}

// startSealing gives the sockets of a connection accepted on ln their
// record layers, if ln's leg is sealed.
func (l *relayLoop) startSealing(ln, down, up *relayEnd) bool {
	var err error
	if ln.sealAccepted {
		down.seal, err = newSealer(false)
	}
	if ln.sealDialed && err == nil {
		up.seal, err = newSealer(true)
	}
	return err == nil
}

// readable: e may be read (its bytes have somewhere to go).
func (e *relayEnd) readable() bool {
	return !e.eof && !e.peer.connecting && len(e.peer.out) == 0
}

// flush writes what waits for e, then shuts its write side if its peer
// is done. It reports false if the connection was closed on an error.
func (l *relayLoop) flush(e *relayEnd) bool {
	for len(e.out) > 0 {
		n, errno := rawWrite(e.fd, e.out)
		if errno == unix.EAGAIN {
			return true
		}
		if errno != 0 {
			l.close(e)
			return false
		}
		e.out = e.out[n:]
	}
	e.out = e.outBuf[:0]
	if e.shutWrite {
		e.shutWrite = false
		unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(e.fd), unix.SHUT_WR, 0)
	}
	return true
}

// update registers the interest e needs now: readable when its bytes can
// go somewhere, writable while something waits for it or it connects.
func (l *relayLoop) update(e *relayEnd) {
	if e.closed {
		return
	}
	var want uint32
	if e.readable() {
		want |= unix.EPOLLIN
	}
	if e.connecting || len(e.out) > 0 {
		want |= unix.EPOLLOUT
	}
	if e.registered && want == e.events {
		return
	}
	if err := l.watch(e, want); err != nil {
		l.close(e)
	}
}

func (l *relayLoop) watch(e *relayEnd, want uint32) error {
	op := unix.EPOLL_CTL_MOD
	if !e.registered {
		op = unix.EPOLL_CTL_ADD
	}
	ev := unix.EpollEvent{Events: want, Fd: int32(e.fd)}
	_, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(l.ep), uintptr(op), uintptr(e.fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	if errno != 0 {
		return fmt.Errorf("relay: epoll_ctl: %w", errno)
	}
	e.registered, e.events = true, want
	return nil
}

// close closes a connection's two sockets (closing removes them from the
// epoll set).
func (l *relayLoop) close(e *relayEnd) {
	for _, x := range []*relayEnd{e, e.peer} {
		if x == nil || x.closed {
			continue
		}
		x.closed = true
		unix.RawSyscall(unix.SYS_CLOSE, uintptr(x.fd), 0, 0)
		delete(l.ends, x.fd)
	}
}

func (l *relayLoop) closeAll() {
	for _, e := range l.ends {
		if !e.closed {
			e.closed = true
			unix.Close(e.fd)
		}
	}
}

func setNoDelay(fd int) {
	one := int32(1)
	unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY, uintptr(unsafe.Pointer(&one)), 4, 0)
}

// rawSockaddr is sa in the kernel's layout, for a raw connect.
func rawSockaddr(sa unix.SockaddrInet4) unix.RawSockaddrInet4 {
	r := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: sa.Addr}
	r.Port = uint16(sa.Port>>8) | uint16(sa.Port&0xff)<<8 // network byte order
	return r
}

func rawRead(fd int, p []byte) (int, syscall.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if errno != 0 {
		return -1, errno
	}
	return int(n), 0
}

func rawWrite(fd int, p []byte) (int, syscall.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}

// rawEpollWait blocks in epoll_wait without entering the runtime's system
// call bookkeeping (see relayMain).
func rawEpollWait(ep int, evs []unix.EpollEvent) (int, syscall.Errno) {
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), ^uintptr(0), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}
