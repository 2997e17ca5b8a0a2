package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ztunnel-go/ztunnel/internal/demo"
	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// -mixed DIR (with -peer) is an interop run: hbone-cross-node once with
// the client's node running this tree's ztunnel and the server's node the
// peer, and once the other way round, under the same load and checks as
// every scenario. Each direction gets a cluster of its own, built after
// the main scenarios and removed before the next.
//
// The two ztunnels must trust each other's certificates. Upstream's
// FAKE_CA signs with a test root compiled into it, so ours is given that
// root as its plug-in CA: DIR holds it in LOCAL_CA_DIR's layout
// (ca-cert.pem and root-cert.pem: upstream's src/tls/root-cert.pem;
// ca-key.pem: its src/tls/ca-key.pem), made by hand like the peer binary.
// The local config then names the trust domain, which upstream's FAKE_CA
// otherwise leaves empty in the SPIFFE ids it issues.

const mixedPrefixSuffix = "m"

// checkMixedCA fails early on a -mixed directory that our ztunnel could
// not load.
func checkMixedCA(dir string) error {
	if _, err := identity.LoadLocalCA(dir); err != nil {
		return fmt.Errorf("-mixed %s: %w", dir, err)
	}
	return nil
}

// runMixed runs hbone-cross-node both ways round between ours and the
// peer; each result's Ztunnel is "<client side>→<server side>".
func runMixed(ctx context.Context, cfg config, tmp, ours string, progress io.Writer) ([]ScenarioResult, error) {
	d, _ := findScenario(scCrossNode)
	peer := peerLabel(cfg.peer)
	var out []ScenarioResult
	for _, peerNode := range []int{2, 1} { // node1 holds the client pods
		label := ourLabel + "→" + peer
		if peerNode == 1 {
			label = peer + "→" + ourLabel
		}
		sr, err := runMixedOnce(ctx, cfg, tmp, ours, peerNode, label, d, progress)
		if err != nil {
			return nil, fmt.Errorf("mixed %s: %w", label, err)
		}
		out = append(out, sr)
	}
	return out, nil
}

func runMixedOnce(ctx context.Context, cfg config, tmp, ours string, peerNode int, label string, d scenarioDef, progress io.Writer) (_ ScenarioResult, err error) {
	mcfg := cfg
	mcfg.prefix = cfg.prefix + mixedPrefixSuffix
	dir := filepath.Join(tmp, "mixed-"+strconv.Itoa(peerNode))
	fmt.Fprintf(progress, "bench: [%s] building a cluster with %s on node%d\n", label, cfg.peer, peerNode)
	mesh, servers, err := buildMesh(ctx, mcfg, demo.MeshOptions{
		Binary:      ours,
		Dir:         dir,
		Env:         []string{"LOCAL_CA_DIR=" + cfg.mixedCA},
		NodeBinary:  map[int]string{peerNode: cfg.peer},
		NodeEnv:     map[int][]string{peerNode: peerEnv},
		TrustDomain: "cluster.local",
	})
	if err != nil {
		keepStartLogs(dir, filepath.Join(cfg.outDir, "mixed"), progress)
		return ScenarioResult{}, err
	}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
		if err != nil {
			if out := filepath.Join(cfg.outDir, "mixed"); os.MkdirAll(out, 0o755) == nil {
				saveLogs(mesh, out, progress)
			}
		}
		mesh.Close()
	}()
	// peer: the peer's node has no garbage-collection endpoint.
	r := &runner{cfg: mcfg, mesh: mesh, servers: servers, log: progress, tag: "[" + label + "] ", peer: true}
	sr, err := r.run(ctx, d)
	if err != nil {
		return sr, err
	}
	sr.Ztunnel = label
	return sr, nil
}
