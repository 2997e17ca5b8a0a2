package inpod

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

func TestNewNetnsValidates(t *testing.T) {
	cases := []struct {
		name    string
		path    string
		wantErr string
	}{
		{name: "own netns", path: "/proc/self/ns/net"},
		{name: "regular file", path: "/dev/null", wantErr: "not a network namespace"},
		{name: "other namespace type", path: "/proc/self/ns/uts", wantErr: "not a network namespace"},
		{name: "missing path", path: "/nonexistent/netns", wantErr: "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDCount(t)
			ns, err := OpenNetns(tc.path, NetnsOptions{})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				var st unix.Stat_t
				if err := unix.Stat(tc.path, &st); err != nil {
					t.Fatal(err)
				}
				if ns.ID().Inode != st.Ino {
					t.Fatalf("ID %v, want inode %d", ns.ID(), st.Ino)
				}
				if err := ns.Close(); err != nil {
					t.Fatal(err)
				}
				if err := ns.Close(); err != nil {
					t.Fatalf("second Close: %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if after := openFDCount(t); after != before {
				t.Fatalf("open fds %d → %d", before, after)
			}
		})
	}
}

func TestNetnsClosed(t *testing.T) {
	ns, err := OpenNetns("/proc/self/ns/net", NetnsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	if _, err := ns.Listen("tcp", "127.0.0.1:0"); !errors.Is(err, ErrNetnsClosed) {
		t.Fatalf("Listen after Close: %v", err)
	}
}

type syscallConner interface {
	SyscallConn() (syscall.RawConn, error)
}

func withFD(t *testing.T, c syscallConner, fn func(fd int)) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Control(func(fd uintptr) { fn(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}

func getsockopt(t *testing.T, c syscallConner, level, opt int) int {
	t.Helper()
	var v int
	var serr error
	withFD(t, c, func(fd int) { v, serr = unix.GetsockoptInt(fd, level, opt) })
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}

// socketNetns returns the inode of the netns a socket belongs to (SIOCGSKNS).
func socketNetns(t *testing.T, c syscallConner) uint64 {
	t.Helper()
	var nsfd int
	var serr error
	withFD(t, c, func(fd int) { nsfd, serr = unix.IoctlRetInt(fd, unix.SIOCGSKNS) })
	if serr != nil {
		t.Fatal(serr)
	}
	defer unix.Close(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func threadNetns(t *testing.T) string {
	t.Helper()
	l, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// openPod makes a netns "pod" named name and opens it with opts; both go
// at the end of the test. It skips when not root.
func openPod(t testing.TB, name string, opts NetnsOptions) *Netns {
	t.Helper()
	nstest.RequireRoot(t)
	pod := nstest.New(t, name)
	ns, err := OpenNetns(pod.Path(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func TestNetnsSockets(t *testing.T) {
	ns := openPod(t, "inpod-sock", NetnsOptions{Mark: 0x539, ReusePort: true})
	host := threadNetns(t)

	ln, err := ns.Listen("tcp", "127.0.0.1:15008", ListenTransparent(true))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tl := ln.(*net.TCPListener)
	wantSockopts(t, "listener", tl, []sockoptWant{
		{"SO_MARK", unix.SOL_SOCKET, unix.SO_MARK, 0x539},
		{"SO_REUSEPORT", unix.SOL_SOCKET, unix.SO_REUSEPORT, 1},
		{"IP_TRANSPARENT", unix.SOL_IP, unix.IP_TRANSPARENT, 1},
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	})
	// SO_REUSEPORT lets a second ztunnel bind the same port.
	ln2, err := ns.Listen("tcp", "127.0.0.1:15008")
	if err != nil {
		t.Fatalf("second listener with SO_REUSEPORT: %v", err)
	}
	ln2.Close()

	var wg sync.WaitGroup
	defer wg.Wait()
	accepted := make(chan map[string]int, 1)
	wg.Go(func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- readSockopts(c.(*net.TCPConn), keepAliveOpts)
			c.Write([]byte("in pod"))
			c.Close()
		}
		close(accepted)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Reachable from inside the pod netns, through our own Dial...
	c, err := ns.Dial(ctx, "tcp", "127.0.0.1:15008", 0x539)
	if err != nil {
		t.Fatal(err)
	}
	wantSockopts(t, "dialed", c.(*net.TCPConn), []sockoptWant{
		{"SO_MARK", unix.SOL_SOCKET, unix.SO_MARK, 0x539},
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
		{"TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY, 1},
	})
	// A refused dial (the socket made in the pod, the connect failing after
	// the thread left it) returns an error and leaves no thread behind.
	if rc, err := ns.Dial(ctx, "tcp", "127.0.0.1:1", 0x539); err == nil {
		rc.Close()
		t.Error("dial to a closed port in the pod succeeded")
	}
	for name, sc := range map[string]syscallConner{"listener": tl, "dialed": c.(*net.TCPConn)} {
		if got := socketNetns(t, sc); got != ns.ID().Inode {
			t.Errorf("%s socket in netns %d, want the pod's %d", name, got, ns.ID().Inode)
		}
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "in pod" {
		t.Fatalf("read %q", got)
	}
	// Keep-alive as net.ListenConfig's default sets it per connection,
	// inherited from the listener instead.
	opts := <-accepted
	for _, o := range keepAliveOpts {
		if opts[o.name] != o.want {
			t.Errorf("accepted %s = %d, want %d", o.name, opts[o.name], o.want)
		}
	}
	// DialFrom: the connection leaves from the given source (bound before
	// the connect starts, with IP_TRANSPARENT), and the listener sees it.
	src := netip.MustParseAddr("127.0.0.7")
	peer := make(chan netip.AddrPort, 1)
	wg.Go(func() {
		c, err := ln.Accept()
		if err == nil {
			peer <- c.RemoteAddr().(*net.TCPAddr).AddrPort()
			c.Close()
		}
		close(peer)
	})
	fc, err := ns.Dial(ctx, "tcp", "127.0.0.1:15008", 0x539, DialFrom(src))
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	wantSockopts(t, "dialed from", fc.(*net.TCPConn), []sockoptWant{
		{"IP_TRANSPARENT", unix.SOL_IP, unix.IP_TRANSPARENT, 1},
		{"SO_MARK", unix.SOL_SOCKET, unix.SO_MARK, 0x539},
	})
	if got := fc.LocalAddr().(*net.TCPAddr).AddrPort(); got.Addr() != src {
		t.Errorf("dialed from %s: local address %s", src, got)
	}
	if got := fc.RemoteAddr().String(); got != "127.0.0.1:15008" {
		t.Errorf("dialed from %s: remote address %s", src, got)
	}
	if got := <-peer; got != fc.LocalAddr().(*net.TCPAddr).AddrPort() {
		t.Errorf("listener saw %s, dialer is %s", got, fc.LocalAddr())
	}
	fc.Close()
	udp, err := ns.ListenPacket("udp", "127.0.0.1:15053")
	if err != nil {
		t.Fatal(err)
	}
	if got := getsockopt(t, udp.(*net.UDPConn), unix.SOL_SOCKET, unix.SO_MARK); got != 0x539 {
		t.Errorf("udp SO_MARK = %#x", got)
	}
	udp.Close()

	// Every thread used is back in the host namespace.
	for range 4 * runtime.GOMAXPROCS(0) {
		ch := make(chan string, 1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			l, _ := os.Readlink("/proc/thread-self/ns/net")
			ch <- l
		}()
		if l := <-ch; l != host {
			t.Fatalf("a thread is in %s, host is %s", l, host)
		}
	}
}

// keepAliveOpts: keep-alive after 15 s, then every 15 s.
var keepAliveOpts = []sockoptWant{
	{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
	{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15},
}

// readSockopts reads the options ws of c by name, -1 for one that cannot
// be read; for goroutines that must not call t.Fatal.
func readSockopts(c *net.TCPConn, ws []sockoptWant) map[string]int {
	got := map[string]int{}
	rc, err := c.SyscallConn()
	if err != nil {
		return got
	}
	rc.Control(func(fd uintptr) {
		for _, w := range ws {
			v, err := unix.GetsockoptInt(int(fd), w.level, w.opt)
			if err != nil {
				v = -1
			}
			got[w.name] = v
		}
	})
	return got
}

type sockoptWant struct {
	name       string
	level, opt int
	want       int
}

// wantSockopts checks integer socket options of c.
func wantSockopts(t *testing.T, what string, c syscallConner, ws []sockoptWant) {
	t.Helper()
	for _, w := range ws {
		if got := getsockopt(t, c, w.level, w.opt); got != w.want {
			t.Errorf("%s %s = %#x, want %#x", what, w.name, got, w.want)
		}
	}
}

// TestDialFromSharesPorts: connections from one source address to
// different destinations may share a local port, as connections without a
// bound source do, because the port is chosen at connect(2). With the
// pod's ephemeral range cut to one port, a dial from the same source to
// each of two listeners succeeds; a port chosen at bind(2) would fail the
// second with EADDRINUSE.
func TestDialFromSharesPorts(t *testing.T) {
	ns := openPod(t, "inpod-ports", NetnsOptions{Mark: 0x539})
	if err := ns.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40000"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	src := netip.MustParseAddr("127.0.0.9")
	for _, addr := range []string{"127.0.0.1:7001", "127.0.0.1:7002"} {
		ln, err := ns.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := ns.Dial(ctx, "tcp", addr, 0x539, DialFrom(src))
		if err != nil {
			t.Fatalf("dial %s from %s with one ephemeral port: %v", addr, src, err)
		}
		defer c.Close()
		if got, want := c.LocalAddr().(*net.TCPAddr).AddrPort(), netip.AddrPortFrom(src, 40000); got != want {
			t.Errorf("dial %s: local address %s, want %s", addr, got, want)
		}
	}
}
