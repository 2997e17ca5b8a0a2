package main

// Tests of the report: targets, the table's rows, results.json and the SVG.

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTargets(t *testing.T) {
	direct := ScenarioResult{Name: scDirect, Throughput1: 10, Latency: Latency{P50: 100, P99: 300}, LatencyHOL: Latency{P99: 900}, HOLSlowTurnP99: 310, HOLSlowIdleTurnP99: 300}
	// good's full-rate ratio (10) does not count: only the slow-reader one is a target.
	good := ScenarioResult{Name: scCrossNode, Throughput1: 6, Latency: Latency{P50: 150, P99: 450}, LatencyHOL: Latency{P99: 4500}, HOLSlowTurnP99: 890, HOLSlowIdleTurnP99: 450,
		CPUVCPU: 0.02, RSSMB: 10, BytesPerIdleConn: 8000, ConnPerS: 9000}
	bad := ScenarioResult{Name: scCrossNode, Throughput1: 4, Latency: Latency{P50: 250, P99: 600}, LatencyHOL: Latency{P99: 900}, HOLSlowTurnP99: 6000, HOLSlowIdleTurnP99: 600,
		CPUVCPU: 0.05, RSSMB: 20, BytesPerIdleConn: 20000, ConnPerS: 1000}
	noHOL := good
	noHOL.HOLSlowTurnP99, noHOL.HOLSlowIdleTurnP99 = 0, 0
	cases := []struct {
		name    string
		rs      []ScenarioResult
		ran     phaseSet
		met     int
		noted   int // "not measured"
		p50Step float64
	}{
		{"all met", []ScenarioResult{direct, good}, allPhases, 8, 0, 50},
		{"all missed", []ScenarioResult{direct, bad}, allPhases, 0, 0, 150},
		{"no direct: relative goals not measured, HOL is", []ScenarioResult{good}, allPhases, 5, 3, 150},
		{"no cross-node: nothing measured", []ScenarioResult{direct}, allPhases, 0, 8, -100},
		{"no HOL samples: HOL not measured", []ScenarioResult{direct, noHOL}, allPhases, 7, 1, 50},
		{"-phases hol: the others not measured", []ScenarioResult{direct, good}, phaseSet{phHOL}, 1, 7, 50},
		{"-phases latency,idle", []ScenarioResult{direct, good}, phaseSet{phLatency, phIdle}, 5, 3, 50},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := targets(tc.rs, tc.ran)
			met, noted := 0, 0
			for _, x := range ts {
				if x.Met {
					met++
				}
				if strings.HasPrefix(x.Note, notMeasured) {
					noted++
				}
			}
			if len(ts) != 8 || met != tc.met || noted != tc.noted || ts[1].Value != tc.p50Step {
				t.Fatalf("%d targets, %d met, %d noted, p50 step %v: %+v", len(ts), met, noted, ts[1].Value, ts)
			}
		})
	}
}

// TestTargetsRelayPair: with relay-pair (and sealed-relay-pair) in the
// run, the five targets they compare on carry their figures and whether
// they would meet the goal; the memory and head-of-line targets do not,
// and the verdict on hbone-cross-node itself is unchanged.
func TestTargetsRelayPair(t *testing.T) {
	direct := ScenarioResult{Name: scDirect, Throughput1: 10, Latency: Latency{P50: 100, P99: 300}, HOLSlowTurnP99: 310, HOLSlowIdleTurnP99: 300}
	x := ScenarioResult{Name: scCrossNode, Throughput1: 3, Latency: Latency{P50: 250, P99: 600}, HOLSlowTurnP99: 500, HOLSlowIdleTurnP99: 450,
		CPUVCPU: 0.05, RSSMB: 10, BytesPerIdleConn: 8000, ConnPerS: 2000}
	y := ScenarioResult{Name: scRelayPair, Relays: true, Throughput1: 6, Latency: Latency{P50: 180, P99: 350}, CPUVCPU: 0.04, RSSMB: 30, ConnPerS: 4000}
	z := ScenarioResult{Name: scSealedRelayPair, Relays: true, Throughput1: 4.5, Latency: Latency{P50: 200, P99: 400}, CPUVCPU: 0.02, RSSMB: 30, ConnPerS: 3900}
	without := targets([]ScenarioResult{direct, x}, allPhases)
	with := targets([]ScenarioResult{direct, y, z, x}, allPhases)
	want := []string{
		"two bare relays: 0.6, meets it",
		"two bare relays: 80, meets it",
		"two bare relays: 50, meets it",
		"two bare relays: 0.04, would miss it too",
		"",
		"",
		"two bare relays: 4000, would miss it too",
		"",
	}
	wantSealed := []string{"0.45, would miss it too", "100, meets it", "100, meets it", "0.02, meets it", "", "", "3900, would miss it too", ""}
	for i, tg := range with {
		if tg.Met != without[i].Met || tg.Value != without[i].Value {
			t.Errorf("%s: relay-pair changed the verdict: %+v vs %+v", tg.Name, tg, without[i])
		}
		if want[i] == "" {
			if tg.RelayPair != nil || tg.SealedRelayPair != nil || strings.Contains(tg.Note, "relays") || strings.Contains(tg.Note, "sealing") {
				t.Errorf("%s: carries a relay-pair figure: %+v", tg.Name, tg)
			}
			continue
		}
		if tg.RelayPair == nil || !strings.Contains(tg.Note, want[i]) {
			t.Errorf("%s: note %q, want it to contain %q", tg.Name, tg.Note, want[i])
		}
		if tg.SealedRelayPair == nil || !strings.Contains(tg.Note, "; sealing between them (AES-GCM): "+wantSealed[i]) {
			t.Errorf("%s: note %q, want the sealed relays' %q after the bare ones'", tg.Name, tg.Note, wantSealed[i])
		}
	}
	// relay-pair alone: no sealed figure.
	for _, tg := range targets([]ScenarioResult{direct, y, x}, allPhases) {
		if tg.SealedRelayPair != nil || strings.Contains(tg.Note, "sealing") {
			t.Errorf("%s: a sealed figure without sealed-relay-pair: %+v", tg.Name, tg)
		}
	}
	// Without direct, the relative targets are not measured for either.
	for _, tg := range targets([]ScenarioResult{y, x}, allPhases)[:3] {
		if tg.RelayPair != nil {
			t.Errorf("%s: relay-pair figure without direct: %+v", tg.Name, tg)
		}
	}
	// A phase the run left out has no yardstick figure either.
	for _, tg := range targets([]ScenarioResult{direct, y, z, x}, phaseSet{phLatency}) {
		if tg.Name == targetP99 && tg.RelayPair == nil {
			t.Errorf("%s: no relay-pair figure with its phase run: %+v", tg.Name, tg)
		}
		if (tg.Name == with[0].Name || tg.Name == with[6].Name) && (tg.RelayPair != nil || tg.SealedRelayPair != nil || !strings.HasPrefix(tg.Note, notMeasured)) {
			t.Errorf("%s: its phase was left out, yet: %+v", tg.Name, tg)
		}
	}
}

func TestHOLTargetNotesDirectFloor(t *testing.T) {
	direct := ScenarioResult{Name: scDirect, Latency: Latency{P99: 300}, LatencyHOL: Latency{P99: 9000}, HOLSlowTurnP99: 330, HOLSlowIdleTurnP99: 300}
	x := ScenarioResult{Name: scCrossNode, Latency: Latency{P99: 1000}, LatencyHOL: Latency{P99: 25000}, HOLSlowTurnP99: 1500, HOLSlowIdleTurnP99: 1000}
	for _, tg := range targets([]ScenarioResult{direct, x}, allPhases) {
		if tg.Name != targetHOL {
			continue
		}
		if tg.Value != 1.5 || !tg.Met || !strings.Contains(tg.Note, "direct's own ratio 1.10; with a full-rate bulk stream 25.00, direct's 30.00") {
			t.Fatalf("HOL target %+v", tg)
		}
		// Without the latency phase there is no unloaded p99 for the
		// full-rate ratio: the note leaves it out rather than print zeros.
		x.Latency, direct.Latency = Latency{}, Latency{}
		for _, tg := range targets([]ScenarioResult{direct, x}, phaseSet{phHOL}) {
			if tg.Name == targetHOL && (!tg.Met || tg.Note != "direct's own ratio 1.10") {
				t.Fatalf("HOL target with -phases hol: %+v", tg)
			}
		}
		return
	}
	t.Fatal("no HOL target")
}

// TestOutputShapes checks results.json carries the field names the issue
// fixes and that results.svg is well-formed XML.
func TestOutputShapes(t *testing.T) {
	dir := t.TempDir()
	res := &Results{
		Machine:   machineInfo(),
		Config:    RunConfig{Scenarios: []string{scDirect, scCrossNode}, DurationSeconds: 1, RateRPS: 1000, MessageBytes: msgSize},
		Scenarios: []ScenarioResult{{Name: scDirect, Throughput1: 10, Throughput8: 20, Latency: Latency{P50: 100, P90: 150, P99: 300, P999: 900}}, {Name: scCrossNode, Throughput1: 5, ZtunnelsOnPath: true}},
	}
	res.Targets = targets(res.Scenarios, allPhases)
	jp, err := writeJSON(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(jp)
	if err != nil {
		t.Fatal(err)
	}
	checkResultsJSON(t, b)
	sp, err := writeSVG(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	checkSVG(t, sp)
}

func checkResultsJSON(t *testing.T, b []byte) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	machine, _ := doc["machine"].(map[string]any)
	requireKeys(t, "machine", machine, "cpu_model", "cores", "kernel", "go_version", "busy", "load_start", "harness_lag_start_us")
	scs, _ := doc["scenarios"].([]any)
	if len(scs) == 0 {
		t.Fatal("no scenarios")
	}
	for _, s := range scs {
		sc := s.(map[string]any)
		requireKeys(t, "scenario", sc, "name", "throughput_gbps_1stream", "throughput_gbps_8streams", "latency_us",
			"conn_per_s", "cpu_vcpu_per_1000rps", "rss_mb", "bytes_per_idle_conn", "hol_p99_ratio", "hol_slow_reader_p99_ratio")
		lat, _ := sc["latency_us"].(map[string]any)
		requireKeys(t, "latency_us", lat, "p50", "p90", "p99", "p999")
	}
	tgs, _ := doc["targets"].([]any)
	if len(tgs) == 0 {
		t.Fatal("no targets")
	}
	for _, x := range tgs {
		tg := x.(map[string]any)
		requireKeys(t, "target", tg, "name", "value", "goal", "met")
		if _, ok := tg["met"].(bool); !ok {
			t.Errorf("target met is %T, want bool", tg["met"])
		}
	}
}

// requireKeys reports each of keys that the JSON object m (named what)
// lacks.
func requireKeys(t *testing.T, what string, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks %q", what, k)
		}
	}
}

func checkSVG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := xml.NewDecoder(f)
	rects := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed: %v", filepath.Base(path), err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	if rects < 6 {
		t.Fatalf("only %d rects in the plot", rects)
	}
}

func TestPeerLabel(t *testing.T) {
	cases := []struct{ path, want string }{
		{"/opt/upstream/ztunnel", "ztunnel"},
		{"/tmp/peer", "peer"},
		{"/tmp/ztunnel-go", "peer"}, // would read as ours
	}
	for _, tc := range cases {
		if got := peerLabel(tc.path); got != tc.want {
			t.Errorf("peerLabel(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestPeerRowsInTable(t *testing.T) {
	d := ScenarioResult{Name: scDirect, Ztunnel: ourLabel, Latency: Latency{P50: 100}}
	res := &Results{
		Scenarios:     []ScenarioResult{d, {Name: scCrossNode, Ztunnel: ourLabel, ZtunnelsOnPath: true}},
		Peer:          "ztunnel (/opt/ztunnel)",
		PeerScenarios: []ScenarioResult{{Name: scCrossNode, Ztunnel: "ztunnel", ZtunnelsOnPath: true, Latency: Latency{P50: 300}}},
	}
	res.Targets = targets(res.Scenarios, allPhases)
	res.PeerTargets = targets(append([]ScenarioResult{d}, res.PeerScenarios...), allPhases)
	var b strings.Builder
	printTable(&b, res)
	for _, want := range []string{"hbone-cross-node [ztunnel]", "300 (3.00×)", "target [ztunnel]"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestRelayPairRowInTable: relay-pair's cost columns are its relays' (no
// parentheses, which mark idle ztunnels), it has no idle-connection
// figure, and the legend says what the row is.
func TestRelayPairRowInTable(t *testing.T) {
	d := ScenarioResult{Name: scDirect, Ztunnel: ourLabel, Latency: Latency{P50: 100}, CPUVCPU: 0.004}
	y := ScenarioResult{Name: scRelayPair, Ztunnel: ourLabel, Relays: true, CPUVCPU: 0.0738, CPUSecPerGB: 1.23, Latency: Latency{P50: 250}}
	res := &Results{Scenarios: []ScenarioResult{d, y}}
	var b strings.Builder
	printTable(&b, res)
	out := b.String()
	for _, want := range []string{"relay-pair = the yardstick", "0.0738", "(0.0040)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(0.0738)") {
		t.Errorf("relay-pair's CPU printed as an idle ztunnel's:\n%s", out)
	}
	perGB := false
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "relay-pair ") && strings.Contains(line, "0.0738") && !strings.Contains(line, "–") {
			t.Errorf("relay-pair row has an idle-connection figure: %q", line)
		}
		perGB = perGB || strings.HasPrefix(line, "relay-pair ") && strings.Contains(line, " 1.23 ")
	}
	if !perGB {
		t.Errorf("relay-pair's CPU per GB is not in the table:\n%s", out)
	}
}

func TestMarkBusy(t *testing.T) {
	ts := targets([]ScenarioResult{{Name: scCrossNode, Latency: Latency{P99: 100}, HOLSlowTurnP99: 150, HOLSlowIdleTurnP99: 100}}, allPhases)
	markBusy(ts, false)
	for _, tg := range ts {
		if strings.Contains(tg.Note, "busy") {
			t.Fatalf("calm run: %+v", tg)
		}
	}
	markBusy(ts, true)
	for _, tg := range ts {
		measured := !strings.HasPrefix(tg.Note, notMeasured)
		if measured != strings.Contains(tg.Note, "machine busy") {
			t.Fatalf("busy run: %+v", tg)
		}
	}
}
