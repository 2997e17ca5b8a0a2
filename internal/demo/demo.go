package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// Options configure a demo run.
type Options struct {
	// Binary is the ztunnel executable to run on each node.
	Binary string
	// Keep waits for ctx to end before cleaning up.
	Keep bool
	// Out receives the report.
	Out io.Writer
	// Prefix names the namespaces (default "zd").
	Prefix string
}

const (
	echoPort   = 8080
	adminPort  = 9090 // the port the DENY policy protects
	serviceVIP = "10.96.0.10"
)

// pod is one demo pod.
type pod struct {
	*nstest.Pod
	name string
	sa   string
	mesh bool
}

type node struct {
	*nstest.Node
	cni     *cniemu.Server
	cmd     *exec.Cmd
	logPath string
	exited  chan error
}

// Run builds the cluster, runs the paths, prints the table and cleans up.
// It returns an error if any path did not give its expected result.
func Run(ctx context.Context, opts Options) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("demo: needs root (network namespaces, veth pairs, iptables)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return errors.New("demo: iptables is not installed (scripts/demo installs it)")
	}
	if opts.Prefix == "" {
		opts.Prefix = "zd"
	}
	out := opts.Out
	tmp, err := os.MkdirTemp("", "ztunnel-demo-")
	if err != nil {
		return err
	}
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		os.RemoveAll(tmp)
		fmt.Fprintln(out, "cleaned up: namespaces, veths, iptables rules, sockets and temp files removed")
	}()

	fmt.Fprintln(out, "building the cluster: 2 nodes, 4 pods (3 in the mesh)")
	cluster, err := nstest.NewCluster(opts.Prefix)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, cluster.Close)
	var nodes []*node
	for i := 0; i < 2; i++ {
		n, err := cluster.AddNode()
		if err != nil {
			return err
		}
		nodes = append(nodes, &node{Node: n})
	}
	specs := []struct {
		node       int
		name, sa   string
		mesh, echo bool
	}{
		{0, "client", "client", true, false},
		{0, "echo-a", "echo", true, true},
		{1, "echo-b", "echo", true, true},
		{1, "outside", "", false, true},
	}
	pods := map[string]*pod{}
	for _, s := range specs {
		p, err := nodes[s.node].AddPod(s.name)
		if err != nil {
			return err
		}
		pods[s.name] = &pod{Pod: p, name: s.name, sa: s.sa, mesh: s.mesh}
		if s.echo {
			stop, err := serveEcho(p, s.name)
			if err != nil {
				return err
			}
			cleanups = append(cleanups, stop)
		}
	}

	caDir := filepath.Join(tmp, "cacerts")
	if err := os.Mkdir(caDir, 0o700); err != nil {
		return err
	}
	if err := WritePluginCA(caDir); err != nil {
		return err
	}
	cfgPath := filepath.Join(tmp, "mesh.yaml")
	if err := os.WriteFile(cfgPath, []byte(meshConfig(pods)), 0o600); err != nil {
		return err
	}

	for i, n := range nodes {
		dir := filepath.Join(tmp, fmt.Sprintf("node%d", i+1))
		if err := os.Mkdir(dir, 0o700); err != nil {
			return err
		}
		n.cni, err = cniemu.New(cniemu.Options{Path: filepath.Join(dir, "ztunnel.sock")})
		if err != nil {
			return err
		}
		cctx, cancel := context.WithCancel(context.Background())
		go n.cni.Run(cctx)
		cni := n.cni
		cleanups = append(cleanups, func() { cancel(); cni.Close() })
		n.logPath = filepath.Join(dir, "ztunnel.log")
		if err := n.startZtunnel(opts.Binary, cfgPath, caDir); err != nil {
			return err
		}
		nn := n
		cleanups = append(cleanups, nn.stopZtunnel)
	}
	for _, p := range pods {
		if !p.mesh {
			continue
		}
		if err := cniemu.InstallRedirect(p.Path(), cniemu.RedirectOptions{}); err != nil {
			return err
		}
		f, err := os.Open(p.Path())
		if err != nil {
			return fmt.Errorf("demo: open netns of %s: %w", p.name, err)
		}
		n := nodes[p.Node.Index-1]
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = n.cni.AddPod(actx, "uid-"+p.name, &zdspb.WorkloadInfo{Name: p.name, Namespace: "demo", ServiceAccount: p.sa}, f)
		cancel()
		f.Close()
		if err != nil {
			return fmt.Errorf("demo: enroll %s: %w (ztunnel log: %s)", p.name, err, n.logPath)
		}
	}
	for _, n := range nodes {
		if err := n.waitReady(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "both ztunnels ready; sending traffic from client (node1)")

	results := runPaths(ctx, pods)
	printTable(out, results)
	failed := 0
	for _, r := range results {
		if !r.ok() {
			failed++
		}
	}
	printExplore(out, nodes, cluster.Prefix)
	if opts.Keep && ctx.Err() == nil {
		fmt.Fprintln(out, "--keep: the cluster stays up; press Ctrl-C to clean up")
		<-ctx.Done()
	}
	if failed > 0 {
		return fmt.Errorf("demo: %d of %d paths did not give the expected result", failed, len(results))
	}
	if ctx.Err() != nil && !opts.Keep {
		return ctx.Err()
	}
	return nil
}

func (n *node) startZtunnel(binary, cfgPath, caDir string) error {
	logf, err := os.Create(n.logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(binary)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"LOCAL_XDS_PATH=" + cfgPath,
		"FAKE_CA=true",
		"LOCAL_CA_DIR=" + caDir,
		"XDS_ADDRESS=",
		"INPOD_UDS=" + n.cni.Path(),
		fmt.Sprintf("NODE_NAME=node%d", n.Index),
		"TERMINATION_GRACE_PERIOD_SECONDS=3",
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// No Pdeathsig: it is tied to the forking thread, and a Go thread that
	// exits (a goroutine ending while locked) would kill ztunnel at random.
	// Cleanup stops the process instead.
	// Started from a thread inside the node namespace, the child is born there.
	if err := n.Do(cmd.Start); err != nil {
		logf.Close()
		return fmt.Errorf("demo: start ztunnel on node%d: %w", n.Index, err)
	}
	n.cmd = cmd
	n.exited = make(chan error, 1)
	go func() { n.exited <- cmd.Wait(); logf.Close() }()
	return nil
}

func (n *node) stopZtunnel() {
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(8 * time.Second):
		n.cmd.Process.Kill()
		<-n.exited
	}
}

// waitReady polls the node ztunnel's readiness endpoint from inside the node.
func (n *node) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		select {
		case err := <-n.exited:
			n.exited <- err
			return fmt.Errorf("demo: ztunnel on node%d exited: %v (log: %s)", n.Index, err, n.logPath)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		status, body := httpGet(ctx, n.NS, "127.0.0.1:15021", "/healthz/ready")
		if status == 200 {
			return nil
		}
		last = strings.TrimSpace(body)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("demo: ztunnel on node%d not ready after 20s: %s (log: %s)", n.Index, last, n.logPath)
}

// httpGet does a minimal HTTP/1.0 GET from inside ns.
func httpGet(ctx context.Context, ns *nstest.NS, addr, path string) (int, string) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := ns.Dial(dctx, "tcp", addr)
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path)
	br := bufio.NewReader(c)
	var proto string
	var status int
	if _, err := fmt.Fscanf(br, "%s %d", &proto, &status); err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(br)
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		b = b[i+4:]
	}
	return status, string(b)
}

// serveEcho answers on echoPort and adminPort in the pod: it reads one
// request line and answers "<pod>: <line>".
func serveEcho(p *nstest.Pod, name string) (func(), error) {
	var lns []net.Listener
	var wg sync.WaitGroup
	for _, port := range []int{echoPort, adminPort} {
		ln, err := p.Listen("tcp", netip.AddrPortFrom(p.IP, uint16(port)).String())
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					line, err := bufio.NewReader(c).ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s: %s", name, line)
				}()
			}
		}()
	}
	return func() {
		for _, ln := range lns {
			ln.Close()
		}
		wg.Wait()
	}, nil
}

func meshConfig(pods map[string]*pod) string {
	var b strings.Builder
	b.WriteString("workloads:\n")
	for _, name := range []string{"client", "echo-a", "echo-b"} {
		p := pods[name]
		fmt.Fprintf(&b, `- uid: demo//v1/Pod/demo/%[1]s
  name: %[1]s
  namespace: demo
  serviceAccount: %[2]s
  workloadIps: ["%[3]s"]
  protocol: HBONE
  node: node%[4]d
  workloadName: %[1]s
  canonicalName: %[1]s
  canonicalRevision: v1
`, p.name, p.sa, p.IP, p.Node.Index)
		if strings.HasPrefix(name, "echo") {
			fmt.Fprintf(&b, "  services:\n    \"demo/echo.demo.svc.cluster.local\":\n      80: %d\n", echoPort)
		}
	}
	fmt.Fprintf(&b, `services:
- name: echo
  namespace: demo
  hostname: echo.demo.svc.cluster.local
  vips: ["/%s"]
  ports:
    80: %d
policies:
- name: deny-client-to-admin
  namespace: demo
  scope: Namespace
  action: Deny
  rules:
  - - - principals:
          - Exact: cluster.local/ns/demo/sa/client
    - - destinationPorts: [%d]
`, serviceVIP, echoPort, adminPort)
	return b.String()
}
