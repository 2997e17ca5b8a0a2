package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// slowest picks the meshed scenario with the lowest single-stream
// throughput relative to direct (absolute, if direct was not run).
func slowest(rs []ScenarioResult) (string, bool) {
	best, found := "", false
	low := 0.0
	for _, r := range rs {
		if !r.ZtunnelsOnPath {
			continue
		}
		if !found || r.Throughput1 < low {
			best, low, found = r.Name, r.Throughput1, true
		}
	}
	return best, found
}

// Profile phases (-profile-phase).
const (
	profileHOL  = "hol"  // one bulk stream beside 1000 rps of 1 KiB requests
	profileRPS  = "rps"  // 1000 rps of 1 KiB on reused connections alone: the CPU target's load
	profileBulk = "bulk" // one bulk stream alone: the 1-stream throughput target's load
	profileConn = "conn" // connect + 1 B round trip + close in a closed loop: the connections/s target's load
)

// profiled picks the scenario to profile: for profileRPS and profileConn
// hbone-cross-node (the scenario their targets are about) when it was run;
// otherwise the slowest.
func profiled(rs []ScenarioResult, phase string) (string, bool) {
	if _, ok := byName(rs, scCrossNode); ok && (phase == profileRPS || phase == profileConn) {
		return scCrossNode, true
	}
	return slowest(rs)
}

// profile re-runs the load of phase on scenario d while taking a CPU
// profile of every ztunnel on its path through the admin endpoint inside
// the node namespace, then takes a heap profile. It returns the files
// written (pprof protobufs and, when `go tool pprof` is available, their
// -top text), named <scenario>-<phase>-node<N>.
func (r *runner) profile(ctx context.Context, d scenarioDef, phase, dir string, seconds int) ([]string, error) {
	p := &path{client: r.mesh.Pods[d.client].Pod, server: r.mesh.Pods[d.server].IP, jitter: true}
	var files []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(d.onPath))
	// Warm the path first (HBONE pool connected, certificates cached), so
	// the window holds the phase's steady state, not its setup.
	if _, err := p.openLoop(ctx, 2000, 100*time.Millisecond, true, 4); err != nil {
		return nil, fmt.Errorf("bench: profile warm-up: %w", err)
	}
	r.progress("[%s] profiling: %ds CPU profile of each ztunnel under load %q", d.name, seconds, phase)
	for i, ni := range d.onPath {
		n := r.node(ni)
		wg.Go(func() {
			path := fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds)
			status, body, err := n.Get(ctx, "127.0.0.1:15000", path, time.Duration(seconds)*time.Second+30*time.Second)
			if err == nil && status != 200 {
				err = fmt.Errorf("status %d: %s", status, body)
			}
			if err != nil {
				errs[i] = fmt.Errorf("bench: cpu profile of node%d: %w", ni, err)
				return
			}
			f := filepath.Join(dir, fmt.Sprintf("%s-%s-node%d.cpu.pprof", d.name, phase, ni))
			if err := os.WriteFile(f, body, 0o644); err != nil {
				errs[i] = err
				return
			}
			mu.Lock()
			files = append(files, f)
			mu.Unlock()
		})
	}
	// Load for the profile's whole window (a little longer, so the window
	// never sees the load stop).
	load := time.Duration(seconds)*time.Second + 500*time.Millisecond
	var lerr error
	switch phase {
	case profileRPS:
		_, lerr = p.openLoop(ctx, r.cfg.rate, load, true, latencyConns)
	case profileConn:
		var rate float64
		rate, lerr = p.connRate(ctx, connRateWorkers, load)
		r.progress("[%s] profiled connection loop: %.0f conn/s", d.name, rate)
	case profileBulk:
		var gbit float64
		gbit, _, lerr = p.bulk(ctx, 1, load)
		r.progress("[%s] profiled bulk stream: %.2f Gbit/s", d.name, gbit)
	default:
		_, lerr = r.headOfLine(ctx, p, d, load, sinkPort, nil)
	}
	wg.Wait()
	if err := errors.Join(append(errs, lerr)...); err != nil {
		return files, err
	}
	for _, ni := range d.onPath {
		status, body, err := r.node(ni).Get(ctx, "127.0.0.1:15000", "/debug/pprof/heap", 30*time.Second)
		if err == nil && status != 200 {
			err = fmt.Errorf("status %d", status)
		}
		if err != nil {
			return files, fmt.Errorf("bench: heap profile of node%d: %w", ni, err)
		}
		f := filepath.Join(dir, fmt.Sprintf("%s-%s-node%d.heap.pprof", d.name, phase, ni))
		if err := os.WriteFile(f, body, 0o644); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	var tops []string
	for _, f := range files {
		out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=25", f).Output()
		if err != nil {
			r.progress("go tool pprof -top %s: %v (profiles are still written)", f, err)
			continue
		}
		t := strings.TrimSuffix(f, ".pprof") + ".top.txt"
		if err := os.WriteFile(t, out, 0o644); err != nil {
			return files, err
		}
		tops = append(tops, t)
	}
	return append(files, tops...), nil
}
