package cniemu

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
)

// serveTags answers every connection on ln with "<tag> <original dst>".
// For app listeners (withDst false) only the tag: without NAT in their
// netns there may be no conntrack entry to ask.
func serveTags(t *testing.T, wg *sync.WaitGroup, ln net.Listener, tag string, withDst bool) {
	t.Cleanup(func() { ln.Close() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			msg := tag
			if withDst {
				dst := "-"
				if od, err := sockopt.OriginalDst(c.(*net.TCPConn)); err == nil {
					dst = od.String()
				}
				msg += " " + dst
			}
			io.WriteString(c, msg)
			c.Close()
		}
	})
}

func listen(t *testing.T, ns *nstest.NS, addr string) net.Listener {
	t.Helper()
	ln, err := ns.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func ask(t *testing.T, dial func(ctx context.Context) (net.Conn, error)) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestInstallRedirect(t *testing.T) {
	c := nstest.NewTestCluster(t, "cr")
	node, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	a, err := node.AddPod("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := node.AddPod("b")
	if err != nil {
		t.Fatal(err)
	}
	// Twice: the second run must converge, not duplicate rules.
	for range 2 {
		if err := InstallRedirect(a.Path(), RedirectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("ip", "netns", "exec", a.Name, "iptables-save").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v\n%s", err, out)
	}
	tables := map[string]string{} // table → its rules
	for _, sec := range strings.Split(string(out), "\n*")[1:] {
		name, body, _ := strings.Cut(sec, "\n")
		tables[name] = body
	}
	for _, want := range []struct{ table, rule string }{
		{"mangle", "-A PREROUTING -j ISTIO_PRERT"},
		{"mangle", "-A OUTPUT -j ISTIO_OUTPUT"},
		{"mangle", "-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff"},
		{"mangle", "-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"},
		{"nat", "-A PREROUTING -j ISTIO_PRERT"},
		{"nat", "-A OUTPUT -j ISTIO_OUTPUT"},
		{"nat", "-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT"},
		{"nat", "-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006"},
		{"nat", "-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT"},
		{"nat", "-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT"},
		{"nat", "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT"},
		{"nat", "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"},
	} {
		if n := strings.Count(tables[want.table], want.rule+"\n"); n != 1 {
			t.Errorf("-t %s %q appears %d times in:\n%s", want.table, want.rule, n, out)
		}
	}
	if strings.Contains(string(out), "15053") {
		t.Error("DNS capture installed without RedirectOptions.DNS")
	}
	if out, err := exec.Command("ip", "netns", "exec", a.Name, "ip", "rule").CombinedOutput(); err != nil || !strings.Contains(string(out), "fwmark 0x111/0xfff lookup 100") {
		t.Errorf("ip rule: %v\n%s", err, out)
	}

	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // runs after the listeners' cleanups close them
	serveTags(t, &wg, listen(t, a.NS, "0.0.0.0:15001"), "outbound", true)
	serveTags(t, &wg, listen(t, a.NS, "0.0.0.0:15006"), "inbound-plain", true)
	serveTags(t, &wg, listen(t, a.NS, netip.AddrPortFrom(a.IP, 15008).String()), "hbone", true)
	serveTags(t, &wg, listen(t, a.NS, "127.0.0.1:7000"), "local", true)
	serveTags(t, &wg, listen(t, b.NS, netip.AddrPortFrom(b.IP, 8080).String()), "app-b", false)
	serveTags(t, &wg, listen(t, b.NS, netip.AddrPortFrom(b.IP, 15008).String()), "hbone-b", false)

	aNS, err := inpod.OpenNetns(a.Path(), inpod.NetnsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer aNS.Close()
	bApp := netip.AddrPortFrom(b.IP, 8080).String()
	aPort := func(p uint16) string { return netip.AddrPortFrom(a.IP, p).String() }
	cases := []struct {
		name string
		dial func(ctx context.Context) (net.Conn, error)
		want string
	}{
		{"outbound from the pod lands on 15001 with the real destination",
			func(ctx context.Context) (net.Conn, error) { return a.Dial(ctx, "tcp", bApp) },
			"outbound " + bApp},
		{"outbound HBONE port is captured too",
			func(ctx context.Context) (net.Conn, error) {
				return a.Dial(ctx, "tcp", netip.AddrPortFrom(b.IP, 15008).String())
			},
			"outbound " + netip.AddrPortFrom(b.IP, 15008).String()},
		{"a socket marked 0x539 is not redirected",
			func(ctx context.Context) (net.Conn, error) { return aNS.Dial(ctx, "tcp", bApp, Mark) },
			"app-b"},
		{"a different mark is still redirected",
			func(ctx context.Context) (net.Conn, error) { return aNS.Dial(ctx, "tcp", bApp, 0x538) },
			"outbound " + bApp},
		{"localhost is not redirected",
			func(ctx context.Context) (net.Conn, error) { return a.Dial(ctx, "tcp", "127.0.0.1:7000") },
			"local 127.0.0.1:7000"},
		{"inbound to an app port lands on 15006",
			func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, "tcp", aPort(9090)) },
			"inbound-plain " + aPort(9090)},
		{"inbound to 15008 goes straight to the HBONE listener",
			func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, "tcp", aPort(15008)) },
			"hbone " + aPort(15008)},
		{"a pod without the rules is untouched",
			func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, "tcp", bApp) },
			"app-b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ask(t, tc.dial); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
