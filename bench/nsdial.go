package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// socketFactory makes TCP sockets inside a pod's network namespace ahead
// of need, on one thread locked inside it, so that the workers of the
// new-connection and connection-rate phases can dial from ordinary
// goroutines.
//
// Why: a socket belongs to the namespace of the thread that creates it,
// and the obvious way to dial from a pod — a worker goroutine locked to a
// thread inside the namespace — makes every wait of that worker (the
// request handed to it, connect, the response) cost two thread wake-ups
// instead of one: the runtime thread that notices the event must hand the
// goroutine to its own locked thread. At 1000 requests/s on an otherwise
// idle VM, where each wake-up costs tens of µs, that made direct's
// new-connection p50 1.6-2.1 × a plain connect/round-trip/close loop's
// (1.2-1.5 × with this), and it costs the harness ≈ 20 % more CPU per
// connection, taken from the ztunnels it measures.
// Only socket(2) needs the namespace; connect and the I/O work from any
// thread.
type socketFactory struct {
	fds  chan int
	stop chan struct{}
	done chan struct{} // closed when the factory's thread has returned
	err  error         // why it returned; read after done
}

// socketDepth: sockets made ahead. At 1000 connections/s the factory
// refills far faster than the phase takes them; the depth only covers a
// moment when its thread is not scheduled.
const socketDepth = 64

// With mss > 0 every socket gets that TCP_MAXSEG (path.mss).
func newSocketFactory(pod *nstest.Pod, mss int) *socketFactory {
	f := &socketFactory{fds: make(chan int, socketDepth), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.err = pod.Do(func() error {
			for {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					close(f.fds)
					return fmt.Errorf("bench: socket in %s: %w", pod.Name, err)
				}
				if mss > 0 {
					if err := setMSS(fd, mss); err != nil {
						unix.Close(fd)
						close(f.fds)
						return err
					}
				}
				select {
				case f.fds <- fd:
				case <-f.stop:
					unix.Close(fd)
					close(f.fds)
					return nil
				}
			}
		})
	}()
	return f
}

// close stops the factory and closes the sockets it made and nobody took.
func (f *socketFactory) close() {
	close(f.stop)
	for fd := range f.fds {
		unix.Close(fd)
	}
	<-f.done
}

// dial connects one of the factory's sockets to addr. It does not wait
// for the handshake: the first write waits for it (a write on a
// connecting non-blocking TCP socket fails with EAGAIN, so the runtime
// parks the writer until the socket is writable, i.e. connected), and a
// refused or timed-out connect fails that write.
func (f *socketFactory) dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	var fd int
	var ok bool
	select {
	case fd, ok = <-f.fds:
		if !ok {
			<-f.done
			return nil, fmt.Errorf("bench: socket factory stopped: %w", f.err)
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return nil, fmt.Errorf("bench: connect %s: %w", addr, err)
	}
	file := os.NewFile(uintptr(fd), "tcp")
	c, err := net.FileConn(file) // a dup, registered with the runtime's poller
	file.Close()
	if err != nil {
		return nil, fmt.Errorf("bench: connect %s: %w", addr, err)
	}
	return c, nil
}
