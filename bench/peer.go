package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// -peer runs the same scenarios with another ztunnel binary (issue #11),
// typically upstream's Rust ztunnel built by hand, and reports it beside
// this tree's build: same pods, addresses, servers, load and checks, same
// run, and the same direct baseline for its ratios.
//
// The peer gets a second cluster built exactly like the first (a mesh
// under another namespace prefix, idle while ours is measured and vice
// versa) rather than the first cluster with its ztunnels swapped: the
// topology code stays one (demo.Mesh). Each scenario runs on ours and
// then at once on the peer, so on a shared machine both see nearly the
// same load.
//
// What the peer must understand is upstream's own environment, which the
// harness already uses: LOCAL_XDS_PATH (the shared local config, same
// YAML schema as upstream's), XDS_ADDRESS= (empty: no xDS server),
// FAKE_CA=true (no CA server: upstream then signs with its built-in test
// CA, which exists only in a build with `--features testing`; without it
// upstream panics "fake_ca requires --features testing" at start),
// INPOD_UDS (in-pod mode, the CNI emulator's ZDS socket), NODE_NAME and
// TERMINATION_GRACE_PERIOD_SECONDS. peerEnv adds INPOD_ENABLED=true, which
// upstream releases before in-pod became the default need. This project's
// extensions (LOCAL_CA_DIR, ADMIN_ADDR, …) are set too and ignored by
// upstream: each peer ztunnel then trusts the other through the test CA.
// Both serve upstream's ports (15001/15006/15008, admin 15000, stats 15020,
// readiness 15021).

// peerEnv is added to the peer's environment (see above).
var peerEnv = []string{"INPOD_ENABLED=true"}

// peerPrefixSuffix makes the peer cluster's namespace prefix.
const peerPrefixSuffix = "p"

// ourLabel names this tree's build in results.json's "ztunnel" fields.
const ourLabel = "ztunnel-go"

// peerLabel names the peer binary in the table and results.json: its file
// name, unless that is the name of ours.
func peerLabel(path string) string {
	b := filepath.Base(path)
	if b == "" || b == "." || b == ourLabel {
		return "peer"
	}
	return b
}

// checkPeer fails early, with a clear message, on a -peer path that
// cannot be run.
func checkPeer(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("-peer: %w", err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("-peer %s: not an executable file", path)
	}
	return nil
}

// peerRun is the peer's cluster and runner for the length of a run.
type peerRun struct {
	label  string
	path   string
	r      *runner
	outDir string
}

// startPeer builds the peer's cluster, before any scenario: a peer that
// cannot run fails the run at once, with an error that says what
// upstream needs, instead of after our scenarios.
func startPeer(ctx context.Context, cfg config, tmp string, progress io.Writer) (*peerRun, error) {
	label := peerLabel(cfg.peer)
	pcfg := cfg
	pcfg.prefix = cfg.prefix + peerPrefixSuffix
	fmt.Fprintf(progress, "bench: [%s] building the same cluster with %s\n", label, cfg.peer)
	dir := filepath.Join(tmp, "peer-mesh")
	mesh, servers, err := buildTopology(ctx, pcfg, cfg.peer, dir, peerEnv...)
	if err != nil {
		keepStartLogs(dir, filepath.Join(cfg.outDir, "peer"), progress)
		return nil, peerError(label, cfg.peer, err, dir)
	}
	r := &runner{cfg: pcfg, mesh: mesh, servers: servers, log: progress, tag: "[" + label + "] ", peer: true}
	return &peerRun{label: label, path: cfg.peer, r: r, outDir: cfg.outDir}, nil
}

// run measures scenario d on the peer, right after ours, so both see the
// machine in the same state as nearly as a shared machine allows.
func (pr *peerRun) run(ctx context.Context, d scenarioDef) (ScenarioResult, error) {
	sr, err := pr.r.run(ctx, d)
	if err != nil {
		return sr, peerError(pr.label, pr.path, err, pr.r.mesh.Dir)
	}
	sr.Ztunnel = pr.label
	return sr, nil
}

// close removes the peer's cluster; after a failure its logs are kept in
// <out>/peer first.
func (pr *peerRun) close(failed bool, progress io.Writer) {
	for _, s := range pr.r.servers {
		s.stop()
	}
	if dir := filepath.Join(pr.outDir, "peer"); failed && os.MkdirAll(dir, 0o755) == nil {
		saveLogs(pr.r.mesh, dir, progress)
	}
	pr.r.mesh.Close()
}

// peerError adds to a failure of the peer what upstream ztunnel needs here
// and, when its log says why it stopped, that line.
func peerError(label, path string, err error, meshDir string) error {
	hint := "the peer must run in-pod mode with a local config and no istiod: LOCAL_XDS_PATH, XDS_ADDRESS= (empty), FAKE_CA=true, INPOD_UDS, INPOD_ENABLED=true; upstream ztunnel needs `cargo build --features testing` for FAKE_CA"
	for _, n := range []string{"node1", "node2"} {
		b, rerr := os.ReadFile(filepath.Join(meshDir, n, "ztunnel.log"))
		if rerr != nil {
			continue
		}
		if line := firstLine(b, "fake_ca requires", "panicked", "Error:", "error="); line != "" {
			hint = fmt.Sprintf("%s log: %q; %s", n, line, hint)
			break
		}
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("peer %s (%s): %w (%s)", label, path, err, hint)
}

// firstLine returns the first line of b that contains one of subs,
// trimmed to 200 bytes.
func firstLine(b []byte, subs ...string) string {
	for line := range bytes.Lines(b) {
		for _, s := range subs {
			if bytes.Contains(line, []byte(s)) {
				l := strings.TrimSpace(string(line))
				if len(l) > 200 {
					l = l[:200]
				}
				return l
			}
		}
	}
	return ""
}

// keepStartLogs copies the peer's logs from a cluster that failed to come
// up (and is already gone) into out.
func keepStartLogs(meshDir, out string, progress io.Writer) {
	for _, n := range []string{"node1", "node2"} {
		b, err := os.ReadFile(filepath.Join(meshDir, n, "ztunnel.log"))
		if err != nil || os.MkdirAll(out, 0o755) != nil {
			continue
		}
		f := filepath.Join(out, "ztunnel-"+n+".log")
		if os.WriteFile(f, b[max(0, len(b)-logTail):], 0o644) == nil {
			fmt.Fprintf(progress, "bench: peer log of %s kept in %s\n", n, f)
		}
	}
}
