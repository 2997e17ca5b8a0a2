package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// Mesh is the demo's topology as a reusable building block (for the bench
// harness and end-to-end tests): nodes made by nstest, each with a CNI
// emulator and a real ztunnel process in in-pod mode, one shared local
// config (LOCAL_XDS_PATH) and one shared plug-in CA (LOCAL_CA_DIR). Run
// is built on it.
type Mesh struct {
	// immutable after NewMesh
	Cluster *nstest.Cluster
	Nodes   []*MeshNode         // Nodes[i] is node i+1
	Pods    map[string]*MeshPod // by MeshPodSpec.Name
	Dir     string              // config, CA, sockets and logs

	opts      MeshOptions
	removeDir bool

	mu       sync.Mutex
	cleanups []func() // guarded by mu; run in reverse by Close
	closed   bool     // guarded by mu
}

// MeshOptions describe a Mesh.
type MeshOptions struct {
	// Binary is the ztunnel executable run on each node. Required.
	Binary string
	// Prefix names the namespaces (keep it short). Required.
	Prefix string
	// Nodes is the number of nodes, at least 1.
	Nodes int
	// Pods are created in order. Mesh pods are listed in the config and
	// enrolled (redirect rules plus ZDS AddPod to their node's ztunnel).
	Pods []MeshPodSpec
	// Namespace is the Kubernetes namespace of every workload (default "mesh").
	Namespace string
	// Env is extra environment for every ztunnel; a variable set here
	// overrides the default of the same name.
	Env []string
	// ExtraConfig is appended verbatim to the generated local config
	// (services:, policies: sections). May be empty.
	ExtraConfig string
	// Dir holds config, CA, sockets and logs; empty: a new temp dir that
	// Close removes.
	Dir string
	// NodeBinary, for the node indexes it lists, is the ztunnel executable
	// in place of Binary: interop runs put another implementation on one
	// node.
	NodeBinary map[int]string
	// NodeEnv is extra environment for one node's ztunnel, after Env.
	NodeEnv map[int][]string
	// TrustDomain, when set, is written into every workload of the local
	// config. Another implementation's built-in CA may issue its SPIFFE id
	// from it (upstream's FAKE_CA leaves it empty otherwise).
	TrustDomain string
	// DNSResolverPod names the pod whose IP:53 every ztunnel forwards names
	// outside the mesh to (the resolv.conf they read). Empty: a resolv.conf
	// without servers, so no query ever leaves the cluster.
	DNSResolverPod string
}

// MeshPodSpec is one pod of a Mesh.
type MeshPodSpec struct {
	Node           int    // 1-based node index
	Name           string // unique; also names the netns (<prefix>-<name>)
	ServiceAccount string // default Name
	Mesh           bool
	// WorkloadYAML is appended verbatim to this pod's workload entry in the
	// local config (indented two spaces), e.g. a services: map.
	WorkloadYAML string
}

// MeshPod is a pod of a Mesh.
type MeshPod struct {
	*nstest.Pod
	Name           string
	ServiceAccount string
	Mesh           bool
}

// MeshNode is a node of a Mesh with its CNI emulator and ztunnel process.
type MeshNode struct {
	*nstest.Node
	CNI     *cniemu.Server
	LogPath string

	mesh *Mesh

	mu     sync.Mutex
	cmd    *exec.Cmd  // guarded by mu; nil when stopped
	exited chan error // guarded by mu; receives cmd.Wait's result once
}

// NewMesh builds the cluster, starts one ztunnel per node, enrolls the mesh
// pods and waits until every ztunnel is ready. On error everything made so
// far is removed.
func NewMesh(ctx context.Context, opts MeshOptions) (_ *Mesh, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("demo: mesh: needs root (network namespaces, veth pairs, iptables)")
	}
	if opts.Binary == "" || opts.Prefix == "" || opts.Nodes < 1 {
		return nil, errors.New("demo: mesh: Binary, Prefix and Nodes ≥ 1 are required")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil, errors.New("demo: mesh: iptables is not installed")
	}
	if opts.Namespace == "" {
		opts.Namespace = "mesh"
	}
	m := &Mesh{opts: opts, Pods: map[string]*MeshPod{}, Dir: opts.Dir}
	if m.Dir == "" {
		if m.Dir, err = os.MkdirTemp("", "ztunnel-mesh-"); err != nil {
			return nil, fmt.Errorf("demo: mesh: %w", err)
		}
		m.removeDir = true
	}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	if m.Cluster, err = nstest.NewCluster(opts.Prefix); err != nil {
		return nil, err
	}
	m.addCleanup(m.Cluster.Close)
	for i := 0; i < opts.Nodes; i++ {
		n, err := m.Cluster.AddNode()
		if err != nil {
			return nil, err
		}
		m.Nodes = append(m.Nodes, &MeshNode{Node: n, mesh: m})
	}
	for _, s := range opts.Pods {
		if s.Node < 1 || s.Node > len(m.Nodes) {
			return nil, fmt.Errorf("demo: mesh: pod %s: no node %d", s.Name, s.Node)
		}
		if _, dup := m.Pods[s.Name]; dup || s.Name == "" {
			return nil, fmt.Errorf("demo: mesh: pod name %q empty or repeated", s.Name)
		}
		p, err := m.Nodes[s.Node-1].AddPod(s.Name)
		if err != nil {
			return nil, err
		}
		sa := s.ServiceAccount
		if sa == "" {
			sa = s.Name
		}
		m.Pods[s.Name] = &MeshPod{Pod: p, Name: s.Name, ServiceAccount: sa, Mesh: s.Mesh}
	}

	caDir := filepath.Join(m.Dir, "cacerts")
	if err := os.MkdirAll(caDir, 0o700); err != nil {
		return nil, fmt.Errorf("demo: mesh: %w", err)
	}
	if err := WritePluginCA(caDir); err != nil {
		return nil, err
	}
	if err := os.WriteFile(m.configPath(), []byte(m.localConfig()), 0o600); err != nil {
		return nil, fmt.Errorf("demo: mesh: write config: %w", err)
	}
	resolv := "# no resolvers: names outside the mesh get SERVFAIL\n"
	if name := opts.DNSResolverPod; name != "" {
		p, ok := m.Pods[name]
		if !ok {
			return nil, fmt.Errorf("demo: mesh: DNSResolverPod %q is not a pod", name)
		}
		resolv = "nameserver " + p.IP.String() + "\n"
	}
	if err := os.WriteFile(m.resolvConfPath(), []byte(resolv), 0o600); err != nil {
		return nil, fmt.Errorf("demo: mesh: write resolv.conf: %w", err)
	}

	for _, n := range m.Nodes {
		dir := filepath.Join(m.Dir, fmt.Sprintf("node%d", n.Index))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("demo: mesh: %w", err)
		}
		if n.CNI, err = cniemu.New(cniemu.Options{Path: filepath.Join(dir, "ztunnel.sock")}); err != nil {
			return nil, err
		}
		cctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		cni := n.CNI
		go func() { defer close(done); _ = cni.Run(cctx) }()
		m.addCleanup(func() { cancel(); _ = cni.Close(); <-done })
		n.LogPath = filepath.Join(dir, "ztunnel.log")
		if err := n.start(); err != nil {
			return nil, err
		}
		m.addCleanup(n.Stop)
	}
	// Enroll only once each ztunnel holds its node agent session: an AddPod
	// before that only caches the pod for the snapshot, and a ztunnel may
	// report ready before its snapshot arrives (upstream's does), so the
	// mesh could be handed out with pods not yet served. A cold start of a
	// large binary can take a second or more here.
	for _, n := range m.Nodes {
		wctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := n.CNI.WaitSnapshots(wctx, 1)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("demo: mesh: ztunnel on node%d did not connect to the node agent at %s within %v: %w (ztunnel log: %s)",
				n.Index, n.CNI.Path(), connectTimeout, err, n.LogPath)
		}
	}
	for _, s := range opts.Pods {
		p := m.Pods[s.Name]
		if !p.Mesh {
			continue
		}
		if err := m.enroll(ctx, p); err != nil {
			return nil, err
		}
	}
	for _, n := range m.Nodes {
		if err := n.WaitReady(ctx); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Mesh) configPath() string { return filepath.Join(m.Dir, "mesh.yaml") }

func (m *Mesh) resolvConfPath() string { return filepath.Join(m.Dir, "resolv.conf") }

func (m *Mesh) addCleanup(fn func()) {
	m.mu.Lock()
	m.cleanups = append(m.cleanups, fn)
	m.mu.Unlock()
}

// Close stops every ztunnel and CNI emulator and deletes the namespaces
// (and the temp dir, if NewMesh made it). Safe to call twice.
func (m *Mesh) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	cs := m.cleanups
	m.cleanups = nil
	m.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	if m.removeDir {
		_ = os.RemoveAll(m.Dir)
	}
}

// connectTimeout bounds how long NewMesh waits for a started ztunnel to
// open its node agent (ZDS) session.
const connectTimeout = 20 * time.Second

func (m *Mesh) enroll(ctx context.Context, p *MeshPod) error {
	// DNS capture on, as istio-cni's ambient default: the pod's port-53
	// traffic goes to its ztunnel's DNS proxy.
	if err := cniemu.InstallRedirect(p.Path(), cniemu.RedirectOptions{DNS: true}); err != nil {
		return err
	}
	f, err := os.Open(p.Path())
	if err != nil {
		return fmt.Errorf("demo: mesh: open netns of %s: %w", p.Name, err)
	}
	defer f.Close()
	n := m.Nodes[p.Node.Index-1]
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	info := &zdspb.WorkloadInfo{Name: p.Name, Namespace: m.opts.Namespace, ServiceAccount: p.ServiceAccount}
	if err := n.CNI.AddPod(actx, "uid-"+p.Name, info, f); err != nil {
		return fmt.Errorf("demo: mesh: enroll %s: %w (ztunnel log: %s)", p.Name, err, n.LogPath)
	}
	return nil
}

// localConfig lists every mesh pod as an HBONE workload on its node.
func (m *Mesh) localConfig() string {
	var b strings.Builder
	b.WriteString("workloads:\n")
	for _, s := range m.opts.Pods {
		p := m.Pods[s.Name]
		if !p.Mesh {
			continue
		}
		fmt.Fprintf(&b, `- uid: mesh//v1/Pod/%[5]s/%[1]s
  name: %[1]s
  namespace: %[5]s
  serviceAccount: %[2]s
  workloadIps: ["%[3]s"]
  protocol: HBONE
  node: node%[4]d
  workloadName: %[1]s
  canonicalName: %[1]s
  canonicalRevision: v1
`, p.Name, p.ServiceAccount, p.IP, p.Node.Index, m.opts.Namespace)
		if m.opts.TrustDomain != "" {
			fmt.Fprintf(&b, "  trustDomain: %s\n", m.opts.TrustDomain)
		}
		b.WriteString(s.WorkloadYAML)
	}
	b.WriteString(m.opts.ExtraConfig)
	return b.String()
}

func (n *MeshNode) start() error {
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("demo: mesh: %w", err)
	}
	bin := n.mesh.opts.Binary
	if b := n.mesh.opts.NodeBinary[n.Index]; b != "" {
		bin = b
	}
	cmd := exec.Command(bin)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"LOCAL_XDS_PATH=" + n.mesh.configPath(),
		"FAKE_CA=true",
		"LOCAL_CA_DIR=" + filepath.Join(n.mesh.Dir, "cacerts"),
		"DNS_RESOLV_CONF=" + n.mesh.resolvConfPath(),
		"XDS_ADDRESS=",
		"INPOD_UDS=" + n.CNI.Path(),
		fmt.Sprintf("NODE_NAME=node%d", n.Index),
		"TERMINATION_GRACE_PERIOD_SECONDS=3",
	}, n.mesh.opts.Env...) // os/exec keeps the last value of a repeated name
	cmd.Env = append(cmd.Env, n.mesh.opts.NodeEnv[n.Index]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// No Pdeathsig: it is tied to the forking thread, and a Go thread that
	// exits (a goroutine ending while locked) would kill ztunnel at random.
	// Cleanup stops the process instead.
	// Started from a thread inside the node namespace, the child is born there.
	if err := n.Do(cmd.Start); err != nil {
		logf.Close()
		return fmt.Errorf("demo: mesh: start ztunnel on node%d: %w", n.Index, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	return nil
}

// Pid is the ztunnel process id, 0 when stopped.
func (n *MeshNode) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Exited reports whether the ztunnel process has exited (and how).
func (n *MeshNode) Exited() (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return true, nil
	}
	select {
	case err := <-n.exited:
		n.exited <- err
		return true, err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits for the drain (SIGKILL after 8 s). Safe to
// call when already stopped.
func (n *MeshNode) Stop() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(8 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart stops the ztunnel and starts a fresh process, which gets its
// pods back from the CNI emulator's snapshot, and waits until it is ready.
func (n *MeshNode) Restart(ctx context.Context) error {
	n.Stop()
	if err := n.start(); err != nil {
		return err
	}
	return n.WaitReady(ctx)
}

// WaitReady polls the ztunnel's readiness endpoint (15021) from inside the
// node for up to 20 s.
func (n *MeshNode) WaitReady(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		if done, err := n.Exited(); done {
			return fmt.Errorf("demo: mesh: ztunnel on node%d exited: %v (log: %s)", n.Index, err, n.LogPath)
		}
		status, body, err := n.Get(ctx, "127.0.0.1:15021", "/healthz/ready", 2*time.Second)
		if err == nil && status == http.StatusOK {
			return nil
		}
		last = strings.TrimSpace(string(body))
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("demo: mesh: ztunnel on node%d not ready after 20s: %s (log: %s)", n.Index, last, n.LogPath)
}

// Get does an HTTP GET of path on addr (e.g. "127.0.0.1:15000", the admin
// port) from inside the node namespace, bounded by timeout.
func (n *MeshNode) Get(ctx context.Context, addr, path string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return n.Dial(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("demo: mesh: get %s: %w", path, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("demo: mesh: get %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return resp.StatusCode, body, fmt.Errorf("demo: mesh: get %s: read: %w", path, err)
	}
	return resp.StatusCode, body, nil
}
