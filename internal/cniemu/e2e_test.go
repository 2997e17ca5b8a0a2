package cniemu

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
)

// miniProxy is a PodServer whose pods relay outbound connections: accept on
// 15001, read the original destination, dial it from the pod with the mark,
// and answer "via <uid>: <what the destination said>".
type miniProxy struct{}

type miniPod struct {
	ln net.Listener
	wg sync.WaitGroup
}

func (miniProxy) StartPod(ctx context.Context, uid string, _ inpod.WorkloadInfo, ns *inpod.Netns) (inpod.Pod, error) {
	ln, err := ns.Listen("tcp", "0.0.0.0:15001", inpod.ListenTransparent(false))
	if err != nil {
		return nil, err
	}
	p := &miniPod{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() {
				defer c.Close()
				dst, err := sockopt.OriginalDst(c.(*net.TCPConn))
				if err != nil {
					io.WriteString(c, "no original dst")
					return
				}
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				up, err := ns.Dial(dctx, "tcp", dst.String(), Mark)
				if err != nil {
					io.WriteString(c, err.Error())
					return
				}
				defer up.Close()
				b, _ := io.ReadAll(up)
				io.WriteString(c, "via "+uid+": "+string(b))
			})
		}
	})
	return p, nil
}

func (p *miniPod) Drain(ctx context.Context) error {
	p.ln.Close()
	p.wg.Wait()
	return nil
}

// TestEndToEnd: emulator → ztunnel client → per-pod listener opened by the
// socket factory → redirected app traffic → marked upstream dial.
func TestEndToEnd(t *testing.T) {
	c := nstest.NewTestCluster(t, "ce")
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
	if err := InstallRedirect(a.Path(), RedirectOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	serveTags(t, &wg, listen(t, b.NS, netip.AddrPortFrom(b.IP, 8080).String()), "app-b", false)

	agent := runServer(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	zt, err := inpod.New(inpod.Options{UDSPath: agent.Path(), PodServer: miniProxy{},
		Netns: inpod.NetnsOptions{Mark: Mark, ReusePort: true}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- zt.Run(ctx) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := zt.Shutdown(sctx); err != nil {
			t.Error(err)
		}
		<-done
	})
	if err := agent.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(a.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := agent.AddPod(ctx, "uid-a", &zdspb.WorkloadInfo{Name: "a", Namespace: "default"}, f); err != nil {
		t.Fatal(err)
	}
	got := ask(t, func(ctx context.Context) (net.Conn, error) {
		return a.Dial(ctx, "tcp", netip.AddrPortFrom(b.IP, 8080).String())
	})
	if got != "via uid-a: app-b" {
		t.Fatalf("got %q", got)
	}
}

func TestInstallRedirectOptions(t *testing.T) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, "cniemu-dns")
	if err := InstallRedirectFD(int(ns.Handle), RedirectOptions{DNS: true}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "exec", ns.Name, "iptables-save").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1",
		"--dport 53 -j REDIRECT --to-ports 15053",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if err := InstallRedirect("/dev/null", RedirectOptions{}); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Fatalf("InstallRedirect(/dev/null): %v", err)
	}
}
