package inpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"syscall"
)

// dialLiteral dials ip:port from inside n with d, holding the namespace
// thread only until the socket exists (a socket belongs to the namespace
// it was created in, for life): d's Control hook, which runs after
// socket(2) and before bind and connect, switches the thread back and
// unlocks it, so the connect's wait goes through the runtime poller like
// any dial. Measured with BenchmarkNetnsDial: the whole dial on the
// namespace thread made every connect's completion a hand-off to that
// locked thread, and creating the socket in Do and adopting it with
// net.FileConn cost seven syscalls more (dup, fcntl, SO_TYPE, ...).
func (n *Netns) dialLiteral(ctx context.Context, raddr netip.AddrPort, d *net.Dialer) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	resc := make(chan result, 1)
	// A fresh goroutine, as in Do: if the thread cannot return home it
	// exits still locked and the runtime destroys the thread.
	go func() {
		runtime.LockOSThread()
		if err := n.enter(); err != nil {
			runtime.UnlockOSThread()
			resc <- result{err: err}
			return
		}
		inside := true
		ctrl := d.Control
		dd := *d
		dd.Control = func(network, address string, c syscall.RawConn) error {
			if err := leave(); err != nil {
				return fmt.Errorf("from netns %s: %w", n.id, err)
			}
			inside = false
			runtime.UnlockOSThread()
			if ctrl != nil {
				return ctrl(network, address, c)
			}
			return nil
		}
		c, err := dd.DialContext(ctx, "tcp", raddr.String())
		if inside {
			// The dial ended before Control: no socket, or Control's own
			// switch back failed.
			if lerr := leave(); lerr != nil {
				resc <- result{err: errors.Join(err, fmt.Errorf("from netns %s: %w", n.id, lerr))}
				return // still locked: the thread dies with this goroutine
			}
			runtime.UnlockOSThread()
		}
		resc <- result{c, err}
	}()
	r := <-resc
	return r.c, r.err
}
