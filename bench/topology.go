package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ztunnel-go/ztunnel/internal/demo"
)

// Pod names. client and plain are on node1 so that every scenario's client
// side runs through (or bypasses) the same ztunnel.
const (
	podClient  = "client"     // node1, in the mesh
	podPlain   = "plain"      // node1, not in the mesh: direct's client
	podLocal   = "srv-local"  // node1, in the mesh
	podRemote  = "srv-remote" // node2, in the mesh
	podOutside = "outside"    // node2, not in the mesh
)

var podSpecs = []demo.MeshPodSpec{
	{Node: 1, Name: podClient, Mesh: true, WorkloadYAML: noServices},
	{Node: 1, Name: podPlain},
	{Node: 1, Name: podLocal, ServiceAccount: "server", Mesh: true, WorkloadYAML: noServices},
	{Node: 2, Name: podRemote, ServiceAccount: "server", Mesh: true, WorkloadYAML: noServices},
	{Node: 2, Name: podOutside},
}

// noServices: upstream ztunnel's local config schema requires a services
// map in every workload (its LocalWorkload has no default for it), so a
// -peer built from upstream can read the same file.
const noServices = "  services: {}\n"

var serverPods = []string{podLocal, podRemote, podOutside}

// podSysctls widen each pod's ephemeral port range and let connect reuse
// TIME_WAIT ports: the connection-rate phase opens tens of thousands of
// short connections per scenario, from the client pod and (ztunnel's
// upstream legs) from the server pods. The range starts above every port
// in use here (7001-7003, 150xx). Both are per network namespace, so the
// host is untouched.
var podSysctls = [][2]string{
	{"net.ipv4.ip_local_port_range", "16000 65535"},
	{"net.ipv4.tcp_tw_reuse", "1"},
}

// buildTopology creates the mesh and starts the servers; extraEnv is
// added to every ztunnel's environment.
func buildTopology(ctx context.Context, cfg config, binary, dir string, extraEnv ...string) (*demo.Mesh, map[string]*podServers, error) {
	return buildMesh(ctx, cfg, demo.MeshOptions{Binary: binary, Dir: dir, Env: extraEnv})
}

// buildMesh is buildTopology for a mesh whose binaries, directory and
// extra environment o gives; it fills in the rest.
func buildMesh(ctx context.Context, cfg config, o demo.MeshOptions) (*demo.Mesh, map[string]*podServers, error) {
	o.Prefix, o.Nodes, o.Pods = cfg.prefix, 2, podSpecs
	// Nothing is open when a scenario restarts the ztunnels, so a short
	// drain bound only matters if something went wrong.
	o.Env = append(append([]string{"TERMINATION_GRACE_PERIOD_SECONDS=2"}, o.Env...), strings.Fields(os.Getenv("BENCH_ZTUNNEL_ENV"))...)
	o.Env = withGCTrace(o.Env)
	m, err := demo.NewMesh(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range m.Pods {
		for _, kv := range podSysctls {
			if err := p.Sysctl(kv[0], kv[1]); err != nil {
				m.Close()
				return nil, nil, err
			}
		}
	}
	servers := map[string]*podServers{}
	for _, name := range serverPods {
		s, err := startServers(m.Pods[name].Pod)
		if err != nil {
			for _, s := range servers {
				s.stop()
			}
			m.Close()
			return nil, nil, err
		}
		servers[name] = s
	}
	return m, servers, nil
}

// raiseNofile sets RLIMIT_NOFILE (soft and hard) to need, or, when the
// hard limit cannot be raised (no CAP_SYS_RESOURCE, as in some
// containers), the soft limit to the hard one; it returns the limit now in
// force. Setting it explicitly also makes the ztunnel children inherit it:
// Go restores the original soft limit in children only if the program
// never set it.
func raiseNofile(need uint64) (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, fmt.Errorf("bench: get RLIMIT_NOFILE: %w", err)
	}
	want := syscall.Rlimit{Cur: max(need, r.Cur), Max: max(need, r.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return want.Cur, nil
	}
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, fmt.Errorf("bench: set RLIMIT_NOFILE to %d: %w", r.Cur, err)
	}
	return r.Cur, nil
}

// fdReserve: descriptors a process needs besides the idle connections
// (listeners, HBONE connections, pipes, profiles).
const fdReserve = 2048

// idleFit is how many idle connections fit in limit: the harness holds two
// sockets per connection (client and server side), and so does a ztunnel
// that carries both legs (hbone-same-node).
func idleFit(limit uint64) int {
	if limit <= fdReserve {
		return 0
	}
	return int((limit - fdReserve) / 2)
}

// moduleRoot is the directory of the go.mod the harness was built from.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("bench: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("bench: not inside the ztunnel module (run from the repository)")
	}
	return filepath.Dir(mod), nil
}

// buildZtunnel builds ./cmd/ztunnel into dir the way the image does
// (deploy/daemonset/Dockerfile: static, no cgo, -trimpath, -s -w), so the
// harness measures what ships: a cgo build maps libc too (about 1.8 MiB
// more RSS, measured idle: 7.0 vs 5.2 MiB).
func buildZtunnel(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "ztunnel")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/ztunnel")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bench: go build ./cmd/ztunnel: %w\n%s", err, out)
	}
	return bin, nil
}

// logTail is how much of each ztunnel log a failed run keeps.
const logTail = 1 << 20

// saveLogs copies, for a failed run, the end of every ztunnel's log and
// every line of it above INFO but the GC trace's (access logs at the end
// can push the first warnings out of the tail) into dir.
func saveLogs(m *demo.Mesh, dir string, progress io.Writer) {
	for _, n := range m.Nodes {
		b, err := os.ReadFile(n.LogPath)
		if err != nil {
			continue
		}
		var warn []byte
		for line := range bytes.Lines(b) {
			if !bytes.Contains(line, []byte("level=INFO")) && !bytes.HasPrefix(line, []byte("gc ")) && len(warn) < logTail {
				warn = append(warn, line...)
			}
		}
		base := filepath.Join(dir, fmt.Sprintf("ztunnel-node%d", n.Index))
		if os.WriteFile(base+".log", b[max(0, len(b)-logTail):], 0o644) == nil &&
			os.WriteFile(base+".warnings.log", warn, 0o644) == nil {
			fmt.Fprintf(progress, "bench: ztunnel log of node%d kept in %s.log and %s.warnings.log\n", n.Index, base, base)
		}
	}
}
