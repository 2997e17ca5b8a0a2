package nstest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// RequireRoot skips tb unless the process can manage network namespaces.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("nstest: skipping: needs root to create network namespaces and veth pairs")
	}
}

// NS is one named network namespace.
type NS struct {
	Name   string
	Handle netns.NsHandle
}

// NewNS creates the named namespace (replacing a stale one of the same name
// left by a killed run) with its loopback up.
func NewNS(name string) (*NS, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("nstest: get current netns: %w", err)
	}
	defer orig.Close()
	_ = netns.DeleteNamed(name)
	h, err := netns.NewNamed(name) // also switches this thread into it
	if serr := netns.Set(orig); serr != nil {
		// This thread is stuck in the new namespace; leave it locked so the
		// runtime discards it instead of reusing it.
		runtime.LockOSThread()
		return nil, fmt.Errorf("nstest: return to original netns: %w", serr)
	}
	if err != nil {
		return nil, fmt.Errorf("nstest: create netns %s: %w", name, err)
	}
	n := &NS{Name: name, Handle: h}
	if err := n.linkUp("lo"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// New is NewNS for tests: the namespace is removed when tb ends.
func New(tb testing.TB, name string) *NS {
	tb.Helper()
	n, err := NewNS(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.Close)
	return n
}

// Close deletes the namespace. Sockets still open inside keep it alive
// until they close.
func (n *NS) Close() {
	if n.Handle.IsOpen() {
		n.Handle.Close()
	}
	_ = netns.DeleteNamed(n.Name)
}

// Path is the namespace's bind-mount, usable with setns or `ip netns exec`.
func (n *NS) Path() string { return filepath.Join("/var/run/netns", n.Name) }

// Do runs fn on an OS thread that is inside n. (internal/inpod has the
// production twin of this; nstest cannot use it because inpod's own tests
// build their pods with nstest.) Sockets fn creates belong to
// n and may be used from any goroutine afterwards. Goroutines fn starts do
// not inherit the namespace.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	// A fresh goroutine so a thread that cannot switch back is thrown away
	// (left locked when the goroutine exits) rather than reused.
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("nstest: get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(n.Handle); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("nstest: enter netns %s: %w", n.Name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("nstest: leave netns %s: %w", n.Name, err)
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a listener inside n.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// Dial connects from inside n.
func (n *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Netlink returns a netlink handle bound to n; the caller closes it.
func (n *NS) Netlink() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(n.Handle)
	if err != nil {
		return nil, fmt.Errorf("nstest: netlink in %s: %w", n.Name, err)
	}
	return h, nil
}

func (n *NS) linkUp(name string) error {
	h, err := n.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("nstest: %s: find %s: %w", n.Name, name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("nstest: %s: set %s up: %w", n.Name, name, err)
	}
	return nil
}

// Sysctl writes a /proc/sys value as seen from inside n (net.* sysctls are
// per namespace). key uses dots: "net.ipv4.ip_forward".
func (n *NS) Sysctl(key, value string) error {
	return n.Do(func() error {
		p := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("nstest: %s: sysctl %s=%s: %w", n.Name, key, value, err)
		}
		return nil
	})
}
