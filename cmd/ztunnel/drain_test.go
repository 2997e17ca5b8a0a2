package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// TestDrainOnSIGTERM: a long transfer through ztunnel (in-pod mode, same
// node HBONE) is in flight when SIGTERM arrives. It must complete
// byte-identical within the grace period, a new connection after SIGTERM
// must be refused, and the process must exit 0.
func TestDrainOnSIGTERM(t *testing.T) {
	n := newInpodNode(t, "zdr", "TERMINATION_GRACE_PERIOD_SECONDS=12")
	cl, sv, cmd, exited, logPath := n.cl, n.sv, n.cmd, n.exited, n.logPath
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(sv.IP, 7100).String()
	conn, err := cl.Dial(ctx, "tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const total, chunk = 24 << 20, 1 << 20
	payload := make([]byte, total)
	rand.Read(payload)
	sum := sha256.Sum256(payload)
	sent := make(chan error, 1)
	go func() {
		for off := 0; off < total; off += chunk {
			if _, err := conn.Write(payload[off : off+chunk]); err != nil {
				sent <- err
				return
			}
			time.Sleep(120 * time.Millisecond) // ~3 s in all: still running at SIGTERM
		}
		sent <- conn.(*net.TCPConn).CloseWrite()
	}()
	time.Sleep(500 * time.Millisecond)
	sigAt := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)

	// New connections are refused once the listeners close.
	time.Sleep(300 * time.Millisecond)
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	if c2, err := cl.Dial(dctx, "tcp", dst); err == nil {
		c2.SetReadDeadline(time.Now().Add(2 * time.Second))
		c2.Write([]byte("x"))
		n, rerr := c2.Read(make([]byte, 1))
		c2.Close()
		if rerr == nil {
			t.Errorf("a connection opened after SIGTERM was served (%d bytes)", n)
		}
	}
	dcancel()

	// While draining, readiness says so.
	if code, body, err := nsGet(n.node.NS, "127.0.0.1:15021", "/healthz/ready"); err != nil {
		t.Errorf("readiness unreachable while draining: %v", err)
	} else if code != 503 || !strings.Contains(body, "draining") {
		t.Errorf("readiness while draining = %d %q, want 503 naming draining", code, body)
	}
	if err := <-sent; err != nil {
		t.Fatalf("transfer interrupted by drain: %v\n%s", err, readFile(logPath))
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("no reply after drain started: %v\n%s", err, readFile(logPath))
	}
	want := fmt.Sprintf("%d %s\n", total, hex.EncodeToString(sum[:]))
	if reply != want {
		t.Fatalf("server got %q, want %q", reply, want)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit status after drain: %v\n%s", err, readFile(logPath))
		}
		if d := time.Since(sigAt); d > 12*time.Second {
			t.Fatalf("exit took %v, beyond the grace period", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("ztunnel did not exit after the transfer finished\n%s", readFile(logPath))
	}
}

// inpodNode is one node with a ztunnel process in in-pod mode, its CNI
// emulator, and two enrolled pods: cl and sv (sv runs the sink on 7100).
type inpodNode struct {
	cluster *nstest.Cluster
	cni     *cniemu.Server
	node    *nstest.Node
	cl, sv  *nstest.Pod
	cmd     *exec.Cmd
	exited  chan error
	logPath string
}

func newInpodNode(t *testing.T, prefix string, env ...string) *inpodNode {
	t.Helper()
	return newInpodNodeWith(t, prefix, nil, env...)
}

// newInpodNodeWith runs setup (if not nil) in the new node before ztunnel
// starts; the env it returns is added to ztunnel's.
func newInpodNodeWith(t *testing.T, prefix string, setup func(*nstest.Node) []string, env ...string) *inpodNode {
	t.Helper()
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("inpod: skipping: iptables is not installed (scripts/test installs it)")
	}
	c := nstest.NewTestCluster(t, prefix)
	node, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := node.AddPod("cl")
	if err != nil {
		t.Fatal(err)
	}
	sv, err := node.AddPod("sv")
	if err != nil {
		t.Fatal(err)
	}
	sink(t, sv)

	dir := t.TempDir()
	cfg := fmt.Sprintf(`workloads:
- {uid: c//Pod/d/cl, name: cl, namespace: d, serviceAccount: cl, workloadIps: ["%s"], protocol: HBONE}
- {uid: c//Pod/d/sv, name: sv, namespace: d, serviceAccount: sv, workloadIps: ["%s"], protocol: HBONE}
`, cl.IP, sv.IP)
	cfgPath := filepath.Join(dir, "mesh.yaml")
	os.WriteFile(cfgPath, []byte(cfg), 0o600)
	cni, err := cniemu.New(cniemu.Options{Path: filepath.Join(dir, "ztunnel.sock")})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	go cni.Run(cctx)
	t.Cleanup(func() { ccancel(); cni.Close() })

	logPath := filepath.Join(dir, "ztunnel.log")
	logf, _ := os.Create(logPath)
	t.Cleanup(func() { logf.Close() })
	if setup != nil {
		env = append(env, setup(node)...)
	}
	cmd := exec.Command(binary)
	base := []string{"PATH=" + os.Getenv("PATH"), "FAKE_CA=true", "INPOD_UDS=" + cni.Path()}
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "XDS_ADDRESS=") }) {
		base = append(base, "LOCAL_XDS_PATH="+cfgPath, "XDS_ADDRESS=")
	}
	cmd.Env = append(base, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := node.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Live adds need ztunnel connected (AddPod otherwise only caches).
	if err := cni.WaitSnapshots(ctx, 1); err != nil {
		t.Fatalf("ztunnel did not connect to the CNI agent: %v\n%s", err, readFile(logPath))
	}
	for _, p := range []*nstest.Pod{cl, sv} {
		if err := cniemu.InstallRedirect(p.Path(), cniemu.RedirectOptions{}); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p.Path())
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.Name, prefix+"-")
		if err := cni.AddPod(ctx, "uid-"+name, &zdspb.WorkloadInfo{Name: name, Namespace: "d", ServiceAccount: name}, f); err != nil {
			t.Fatalf("add pod %s: %v\n%s", name, err, readFile(logPath))
		}
		f.Close()
	}

	return &inpodNode{cluster: c, cni: cni, node: node, cl: cl, sv: sv, cmd: cmd, exited: exited, logPath: logPath}
}

// sink answers each connection with "<bytes> <sha256>\n" after reading to EOF.
func sink(t *testing.T, p *nstest.Pod) {
	ln, err := p.Listen("tcp", netip.AddrPortFrom(p.IP, 7100).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				h := sha256.New()
				n, _ := io.Copy(h, c)
				fmt.Fprintf(c, "%d %s\n", n, hex.EncodeToString(h.Sum(nil)))
			}()
		}
	}()
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
