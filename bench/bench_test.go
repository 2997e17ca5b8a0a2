package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/demo"
	"go.uber.org/goleak"
)

func requireRootAndIptables(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bench: skipping: the harness needs root (network namespaces, veth pairs, iptables rules)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("bench: skipping: iptables is not installed (scripts/test installs it)")
	}
}

// leftovers lists namespaces with the prefix still present.
func leftovers(prefix string) []string {
	entries, _ := os.ReadDir("/var/run/netns")
	var left []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			left = append(left, e.Name())
		}
	}
	return left
}

// TestSmoke runs the real harness end to end, very short: it builds
// ztunnel, builds the cluster, measures direct, relay-pair,
// sealed-relay-pair and hbone-cross-node with every byte checked, writes results.json and
// results.svg, prints the table and removes everything it made (relay
// processes included).
func TestSmoke(t *testing.T) {
	requireRootAndIptables(t)
	defer goleak.VerifyNone(t)
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-duration", "150ms", "-scenarios", scRelayPair + "," + scSealedRelayPair + "," + scCrossNode, "-idle-conns", "200", "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	cfg.prefix = "zbt"
	cfg.holTargetPhase = 2 * time.Second // turns: moving, idle, moving
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stdout, progress bytes.Buffer
	res, err := run(ctx, cfg, &stdout, &progress)
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	if left := leftovers("zbt"); len(left) > 0 {
		t.Fatalf("namespaces left behind: %v", left)
	}
	if left := relaysRunning(); len(left) > 0 {
		t.Fatalf("relay processes left behind: %v", left)
	}
	if len(res.Scenarios) != 4 || res.Scenarios[0].Name != scDirect || res.Scenarios[1].Name != scRelayPair ||
		res.Scenarios[2].Name != scSealedRelayPair || res.Scenarios[3].Name != scCrossNode {
		t.Fatalf("scenarios: %+v", res.Scenarios)
	}
	for _, s := range res.Scenarios {
		if s.Throughput1 <= 0 || s.Throughput8 <= 0 || s.ConnPerS <= 0 || s.Latency.P50 <= 0 {
			t.Errorf("%s: a figure is zero: %+v", s.Name, s)
		}
		want := int(0.150 * defaultRate)
		if s.Latency.Count != want || s.LatencyNewConn.Count != want {
			t.Errorf("%s: latency samples %d/%d, want %d each", s.Name, s.Latency.Count, s.LatencyNewConn.Count, want)
		}
		if s.Relays != (s.ClientMSS > 0) || s.ClientMSS >= 65000 || s.ServerMSS != s.ClientMSS {
			t.Errorf("%s: client MSS %d, server MSS %d; want the pod link's MTU less 40 for relays (both legs), none otherwise", s.Name, s.ClientMSS, s.ServerMSS)
		}
		if s.Relays {
			if s.LatencyHOL.Count != 0 || s.LatencyHOLSlow.Count != 0 {
				t.Errorf("relay-pair ran head-of-line phases: %d/%d samples", s.LatencyHOL.Count, s.LatencyHOLSlow.Count)
			}
		} else if s.LatencyHOL.Count != want {
			t.Errorf("%s: head-of-line samples %d, want %d", s.Name, s.LatencyHOL.Count, want)
		}
		// Two seconds: 500 ms moving, a drain, 500 ms idle, 450 ms moving
		// (after the 50 ms margin), a drain.
		if on, off := s.LatencyHOLSlow.Count, s.LatencyHOLSlowIdle.Count; !s.Relays && (on < 400 || off < 200 || s.HOLSlowTurnP99 <= 0 || s.HOLSlowIdleTurnP99 <= 0) {
			t.Errorf("%s: slow-reader phase: %d requests beside the moving stream, %d beside the idle one, turn p99s %v/%v; want ≥ 400 and ≥ 200 and both p99s",
				s.Name, on, off, s.HOLSlowTurnP99, s.HOLSlowIdleTurnP99)
		}
		wantIdle := 200
		if s.Relays {
			wantIdle = 0 // relay-pair has no idle phase
		}
		if s.IdleConns != wantIdle || s.Connections < 200 || s.BytesVerified <= 0 {
			t.Errorf("%s: idle %d, connections %d, verified bytes %d", s.Name, s.IdleConns, s.Connections, s.BytesVerified)
		}
	}
	for _, y := range res.Scenarios[1:3] {
		if !y.Relays || y.ZtunnelsOnPath || len(y.Ztunnels) != 2 || y.CPUVCPU <= 0 || y.CtxSwitchesPerReq <= 0 || y.CPUSecPerGB <= 0 {
			t.Errorf("%s costs: %+v", y.Name, y.Ztunnels)
		}
	}
	if n := res.Targets[0].Note; !strings.Contains(n, "two bare relays") || !strings.Contains(n, "sealing between them") {
		t.Errorf("throughput target's note lacks the yardsticks' figures: %q", n)
	}
	x := res.Scenarios[3]
	if !x.ZtunnelsOnPath || len(x.Ztunnels) != 2 || x.CPUVCPU <= 0 || x.RSSMB <= 0 || x.CtxSwitchesPerReq <= 0 || x.CPUSecPerGB <= 0 {
		t.Errorf("hbone-cross-node costs: %+v", x.Ztunnels)
	}
	// Both ztunnels handle every byte of the stream: each spent CPU and
	// made read/write calls for it.
	for _, z := range x.Ztunnels {
		if z.CPUSecPerGB <= 0 || z.SyscallsPerGB <= 0 {
			t.Errorf("node%d per GB: CPU %v s, syscalls %v", z.Node, z.CPUSecPerGB, z.SyscallsPerGB)
		}
	}
	if d := res.Scenarios[0]; d.LoopNewConn.Count == 0 || d.LoopLatency.Count == 0 || d.LoopNewConn.P50 <= 0 {
		t.Errorf("direct's plain loops were not measured: %+v %+v", d.LoopLatency, d.LoopNewConn)
	}
	if m := res.Machine; m.LagStart.Count == 0 || m.LagEnd.Count == 0 || m.LoadStart.Window <= 0 || m.LoadEnd.Window <= 0 {
		t.Errorf("machine load and lag probes missing: %+v", m.MachineLoad)
	}
	for _, z := range x.Ztunnels {
		if z.ConnsCounted < float64(x.Connections) {
			t.Errorf("node%d counted %v connections, the harness made %d", z.Node, z.ConnsCounted, x.Connections)
		}
	}
	// The GC report covers our ztunnels on the path, not direct or relays.
	if g := x.GC; g == nil || g.Slow < x.Latency.Count/100 || g.SlowNearGC > g.Slow || g.NearGC > x.Latency.Count ||
		(g.NearGC < x.Latency.Count && g.P99AwayFromGC <= 0) {
		t.Errorf("hbone-cross-node GC report: %+v (latency %+v)", g, x.Latency)
	}
	for _, s := range res.Scenarios[:3] {
		if s.GC != nil {
			t.Errorf("%s has a GC report: %+v", s.Name, s.GC)
		}
	}
	if x.HOLHBONEConns != 1 || x.HOLSlowHBONEConns != 1 {
		t.Errorf("head-of-line phases saw %d and %d HBONE connections, want the one pooled connection", x.HOLSlowHBONEConns, x.HOLHBONEConns)
	}
	if x.HOLSlowBulkGbps <= 0 || x.HOLSlowBulkGbps > 2*slowReaderRate*8/1e9 {
		t.Errorf("slow-reader bulk stream moved %.3f Gbit/s, want more than 0 and at most about %.3f", x.HOLSlowBulkGbps, slowReaderRate*8/1e9)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkResultsJSON(t, b)
	checkSVG(t, filepath.Join(out, "results.svg"))
	table := stdout.String()
	for _, want := range []string{"hbone-cross-node", "direct", "target", "×"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// relaysRunning lists processes running as relay-pair's relays.
func relaysRunning() []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte("\x00"+relaySubcommand+"\x00")) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// TestFailsLoudly: a ztunnel that never becomes ready fails the run with
// an error, and the cluster is still removed.
func TestFailsLoudly(t *testing.T) {
	requireRootAndIptables(t)
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false(1)")
	}
	cfg, err := parseFlags([]string{"-duration", "100ms", "-scenarios", scCrossNode, "-idle-conns", "10", "-out", t.TempDir(), "-ztunnel", falseBin})
	if err != nil {
		t.Fatal(err)
	}
	cfg.prefix = "zbf"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = run(ctx, cfg, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ztunnel") {
		t.Fatalf("run with a ztunnel that exits at once: got %v, want an error about ztunnel", err)
	}
	if left := leftovers("zbf"); len(left) > 0 {
		t.Fatalf("namespaces left behind: %v", left)
	}
}

// TestPeerFailsClearly: a -peer that exits at once (not a ztunnel) fails
// the run before any scenario, bounded, with a message naming the peer and
// what upstream needs, and the peer's cluster is removed too.
func TestPeerFailsClearly(t *testing.T) {
	requireRootAndIptables(t)
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false(1)")
	}
	cfg, err := parseFlags([]string{"-duration", "100ms", "-scenarios", scCrossNode, "-idle-conns", "10", "-out", t.TempDir(), "-peer", falseBin})
	if err != nil {
		t.Fatal(err)
	}
	cfg.prefix = "zbq"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, err = run(ctx, cfg, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "peer false") || !strings.Contains(err.Error(), "FAKE_CA") {
		t.Fatalf("run with -peer false: got %v, want an error naming the peer and what it needs", err)
	}
	if left := append(leftovers("zbq"), leftovers("zbqp")...); len(left) > 0 {
		t.Fatalf("namespaces left behind: %v", left)
	}
}

// TestMixedSmoke runs -mixed end to end, very short, with this tree's
// ztunnel standing in for the peer (under another file name) and a plug-in
// CA of our own: both mixed clusters are built with the per-node binary
// and environment, carry hbone-cross-node with every byte checked, show
// in the table and results, and are removed.
func TestMixedSmoke(t *testing.T) {
	requireRootAndIptables(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	built, err := buildZtunnel(ctx, root, dir)
	if err != nil {
		t.Fatal(err)
	}
	// The peer is a script that notes where it runs and with which CA,
	// then becomes our ztunnel.
	peer := filepath.Join(dir, "other-ztunnel")
	ran := filepath.Join(dir, "ran")
	script := "#!/bin/sh\necho \"$NODE_NAME $LOCAL_CA_DIR $INPOD_ENABLED\" >> " + ran + "\nexec " + built + " \"$@\"\n"
	if err := os.WriteFile(peer, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "cacerts")
	if err := os.Mkdir(ca, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := demo.WritePluginCA(ca); err != nil {
		t.Fatal(err)
	}
	// Only the phases the mixed runs' checks read: the others are
	// TestSmoke's, and leaving them out checks -phases on three clusters.
	cfg, err := parseFlags([]string{"-duration", "150ms", "-scenarios", scCrossNode, "-idle-conns", "100", "-out", t.TempDir(), "-peer", peer, "-mixed", ca,
		"-phases", phLatency + "," + phConnRate + "," + phBulk, "-interleave", "2"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.prefix = "zbx"
	cfg.holTargetPhase = 2 * time.Second
	cfg.interleaveSlice = 200 * time.Millisecond
	var stdout, progress bytes.Buffer
	res, err := run(ctx, cfg, &stdout, &progress)
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	for _, p := range []string{"zbx", "zbxp", "zbxm"} {
		if left := leftovers(p); len(left) > 0 {
			t.Fatalf("namespaces left behind: %v", left)
		}
	}
	b, err := os.ReadFile(ran)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node1", "node2"} {
		if line := node + " " + ca + " true"; !strings.Contains(string(b), line) {
			t.Errorf("the peer never ran as %q in a mixed cluster; its starts:\n%s", line, b)
		}
	}
	for _, s := range slices.Concat(res.Scenarios, res.PeerScenarios, res.MixedScenarios) {
		if s.LatencyHOLSlow.Count != 0 || s.LatencyNewConn.Count != 0 || s.IdleConns != 0 || s.BytesPerIdleConn != 0 {
			t.Errorf("%s [%s] ran a phase -phases left out: head-of-line %d requests, new-connection %d, %d idle connections (%.0f B each)",
				s.Name, s.Ztunnel, s.LatencyHOLSlow.Count, s.LatencyNewConn.Count, s.IdleConns, s.BytesPerIdleConn)
		}
	}
	for _, tg := range slices.Concat(res.Targets, res.PeerTargets) {
		if tg.Name == targetHOL && tg.Note != notMeasured+": -phases left out "+phHOL {
			t.Errorf("%s: note %q, want it not measured", tg.Name, tg.Note)
		}
	}
	// -interleave: two paired rounds, every figure measured on both sides.
	if il := res.Interleave; il == nil || len(il.Ours) != 2 || len(il.Peer) != 2 || il.ConnPerS.Rounds != 2 {
		t.Errorf("interleave: %+v, want 2 rounds of ours and the peer", il)
	} else {
		for i := range 2 {
			o, p := il.Ours[i], il.Peer[i]
			if o.ConnPerS <= 0 || p.ConnPerS <= 0 || o.CPUPerConnUS <= 0 || p.CPUPerConnUS <= 0 ||
				o.VCPUAtRate <= 0 || p.VCPUAtRate <= 0 || o.P50AtRateUS <= 0 || p.P50AtRateUS <= 0 ||
				o.P99AtRateUS < o.P50AtRateUS || p.P99AtRateUS < p.P50AtRateUS ||
				o.Gbps1Stream <= 0 || p.Gbps1Stream <= 0 || o.CPUSecPerGB <= 0 || p.CPUSecPerGB <= 0 ||
				o.HOLP50US <= 0 || p.HOLP50US <= 0 || o.HOLP99US < o.HOLP50US || p.HOLP99US < p.HOLP50US {
				t.Errorf("interleave round %d: ours %+v, peer %+v; want every figure measured", i+1, il.Ours[i], il.Peer[i])
			}
		}
		if !strings.Contains(progress.String(), "interleaved hbone-cross-node, 2 rounds") {
			t.Errorf("no interleave summary in the progress output")
		}
	}
	want := []string{"ztunnel-go→other-ztunnel", "other-ztunnel→ztunnel-go"}
	if len(res.MixedScenarios) != 2 {
		t.Fatalf("mixed scenarios: %+v", res.MixedScenarios)
	}
	for i, s := range res.MixedScenarios {
		if s.Ztunnel != want[i] || s.Name != scCrossNode || s.Throughput1 <= 0 || s.ConnPerS <= 0 || s.Latency.P50 <= 0 {
			t.Errorf("mixed run %d: %s [%s], 1-stream %.2f, conn/s %.0f, p50 %.0f; want %s with every figure measured",
				i, s.Name, s.Ztunnel, s.Throughput1, s.ConnPerS, s.Latency.P50, want[i])
		}
		if !strings.Contains(stdout.String(), scCrossNode+" ["+want[i]+"]") {
			t.Errorf("the table has no row for %s", want[i])
		}
	}
}
