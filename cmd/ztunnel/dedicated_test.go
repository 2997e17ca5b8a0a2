package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
	"github.com/ztunnel-go/ztunnel/internal/demo"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// TestDedicatedModeTwoNodes: two ztunnel processes in dedicated mode, each
// inside the network namespace of the one workload it serves, on two nodes
// joined by veth. The client dials the server's real address; its own
// ztunnel (15001, via the pod's redirect rules) tunnels it over HBONE to the
// server's ztunnel (15008), which delivers it. 64 MiB echo byte-identical.
func TestDedicatedModeTwoNodes(t *testing.T) {
	c := nstest.NewTestCluster(t, "zdd")
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("dedicated: skipping: iptables is not installed (scripts/test installs it)")
	}
	var pods []*nstest.Pod
	for i := 0; i < 2; i++ {
		n, err := c.AddNode()
		if err != nil {
			t.Fatal(err)
		}
		p, err := n.AddPod(fmt.Sprintf("w%d", i))
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	cl, sv := pods[0], pods[1]
	dir := t.TempDir()
	caDir := filepath.Join(dir, "ca")
	os.Mkdir(caDir, 0o700)
	if err := demo.WritePluginCA(caDir); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`workloads:
- {uid: c//Pod/a/client, name: client, namespace: a, serviceAccount: client, workloadIps: ["%s"], protocol: HBONE}
- {uid: c//Pod/b/server, name: server, namespace: b, serviceAccount: server, workloadIps: ["%s"], protocol: HBONE}
`, cl.IP, sv.IP)
	cfgPath := filepath.Join(dir, "mesh.yaml")
	os.WriteFile(cfgPath, []byte(cfg), 0o600)

	// The echo server, and in the client pod the redirect rules.
	ln, err := sv.Listen("tcp", netip.AddrPortFrom(sv.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	for _, p := range pods {
		if err := cniemu.InstallRedirect(p.Path(), cniemu.RedirectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range pods {
		info := []string{"a/client/client", "b/server/server"}[i]
		logf, _ := os.Create(filepath.Join(dir, fmt.Sprintf("zt%d.log", i)))
		defer logf.Close()
		cmd := exec.Command(binary)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PROXY_MODE=dedicated", "PROXY_WORKLOAD_INFO=" + info,
			"LOCAL_XDS_PATH=" + cfgPath, "FAKE_CA=true", "LOCAL_CA_DIR=" + caDir, "XDS_ADDRESS=", "PACKET_MARK=1337"}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := p.Do(cmd.Start); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	}
	// Ready once each ztunnel has its listeners and certificate.
	for _, p := range pods {
		deadline := time.Now().Add(15 * time.Second)
		for {
			if code, _, _ := nsGet(p.NS, "127.0.0.1:15021", "/healthz/ready"); code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ztunnel in %s not ready", p.Name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := cl.Dial(ctx, "tcp", netip.AddrPortFrom(sv.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payload := make([]byte, 64<<20)
	rand.Read(payload)
	go func() {
		conn.Write(payload)
		conn.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(conn)
	if err != nil || !bytes.Equal(got, payload) {
		b0, _ := os.ReadFile(filepath.Join(dir, "zt0.log"))
		t.Fatalf("echo: %d bytes (err %v), want %d identical\n%s", len(got), err, len(payload), b0)
	}
	// It really went through both ztunnels over mTLS.
	for i, p := range pods {
		text := scrape(t, p.NS)
		if n := metricSum(text, "istio_tcp_connections_opened_total", `connection_security_policy="mutual_tls"`); n != 1 {
			t.Errorf("ztunnel %d counted %v mTLS connections, want 1", i, n)
		}
	}
}
