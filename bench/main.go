package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Load shape. Each constant is the same in every scenario so the ratios
// compare like with like.
const (
	defaultRate = 1000 // requests per second of the latency phases
	// latencyConns: persistent connections the open-loop phases spread
	// requests over; at 1000 rps and sub-millisecond latency one would do,
	// 16 leave room so a stall queues in the harness (and counts) rather
	// than serializing behind one socket.
	latencyConns = 16
	// newConnWorkers: requests of the new-connection phase in flight at
	// most. An open loop must not be limited by its own workers: with 32,
	// a path (or a starved machine) taking over 32 ms per connection made
	// the harness queue requests at 1000/s, and that queue — the harness —
	// was the figure. Workers are plain goroutines (nsdial.go), cheap to
	// keep waiting; 256 also bounds the sockets open at once.
	newConnWorkers  = 256
	connRateWorkers = 16          // closed-loop dialers of the connection-rate phase
	idleDialers     = 64          // parallel dials when opening idle connections
	idleProbe       = 100         // idle connections opened first to measure descriptors per connection
	rssSampleEvery  = time.Second // median and anonymous peak only: see withCost
	warmUp          = time.Second // 1000 rps on reused connections after each restart
	// idleSettle: wait after a GC before reading RSS, so freed stacks and
	// the GC's own work have settled.
	idleSettle = 300 * time.Millisecond
	holRampUp  = 200 * time.Millisecond // bulk runs alone this long before requests start
	// holTurn is how long the slow-reader bulk stream moves, and then,
	// once drained, stays idle, in turns (headOfLine, alternate); requests
	// due in the first holSettle after it starts moving again count in
	// neither set (a margin: its sender refills the windows within ms).
	holTurn   = 500 * time.Millisecond
	holSettle = 50 * time.Millisecond
	// holTargetPhase is the shortest slow-reader phase of the head-of-line
	// target's scenario and of direct, its reference (others run twice the
	// measurement length): five turns each way, so the median turn's p99 is
	// not one stall's.
	holTargetPhase = 8 * time.Second

	defaultIdleConns = 10000
	quickIdleConns   = 2000
	quickDuration    = time.Second
	quickBudget      = 100 * time.Second
)

// config is the harness configuration after flags.
type config struct {
	duration  time.Duration
	scenarios []string
	outDir    string
	quick     bool
	profile   bool
	// profilePhase: the load the profiles are taken under, profileHOL,
	// profileRPS, profileBulk or profileConn.
	profilePhase string
	binary       string // prebuilt ztunnel; empty: build one
	peer         string // -peer: another ztunnel binary to run the same scenarios with; empty: none
	mixedCA      string // -mixed: the plug-in CA directory for interop runs with the peer; empty: none
	idleConns    int
	rate         int
	prefix       string // namespace prefix
	// holTargetPhase: the shortest slow-reader head-of-line phase of the
	// target's scenario and direct (holTargetPhase; tests shorten it).
	holTargetPhase time.Duration
	phases         phaseSet // -phases: the measurements each scenario runs
	interleave     int      // -interleave: rounds of the paired comparison with the peer (interleave.go); 0: none
	// interleaveSlice: each measurement's length per side in a round
	// (interleaveSlice; tests shorten it).
	interleaveSlice time.Duration
}

// The measurements of a scenario, by the names -phases takes. A run
// limited to some of them leaves the others' figures zero and their
// targets "not measured": a minute-long head-of-line A/B need not also
// open 10 000 idle connections.
const (
	phLatency  = "latency"  // 1000 rps on reused connections: added p50/p99, CPU, RSS, GC
	phHOL      = "hol"      // 1 KiB requests beside a slow-reader, then a full-rate, bulk stream
	phNewConn  = "newconn"  // 1000 rps, a new connection each
	phConnRate = "connrate" // connect, 1 B round trip, close in a closed loop
	phBulk     = "bulk"     // 1- and 8-stream throughput
	phIdle     = "idle"     // memory per idle proxied connection
)

var allPhases = phaseSet{phLatency, phHOL, phNewConn, phConnRate, phBulk, phIdle}

// phaseSet is the phases a run measures, in allPhases' order.
type phaseSet []string

func (s phaseSet) has(ph string) bool { return slices.Contains(s, ph) }

// parsePhases validates -phases' comma list.
func parsePhases(v string) (phaseSet, error) {
	var want []string
	for _, ph := range strings.Split(v, ",") {
		ph = strings.TrimSpace(ph)
		if ph == "" {
			continue
		}
		if !allPhases.has(ph) {
			return nil, fmt.Errorf("-phases: unknown %q (want some of %s)", ph, strings.Join(allPhases, ","))
		}
		want = append(want, ph)
	}
	var s phaseSet
	for _, ph := range allPhases {
		if slices.Contains(want, ph) {
			s = append(s, ph)
		}
	}
	if len(s) == 0 {
		return nil, errors.New("-phases: empty")
	}
	return s, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == relaySubcommand {
		if err := relayMain(os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "bench: interrupted (%v); no results written\n", err)
		} else {
			fmt.Fprintf(os.Stderr, "bench: FAIL: %v\n", err)
		}
		stop()
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	dur := fs.Duration("duration", 5*time.Second, "length of each measurement")
	scen := fs.String("scenarios", strings.Join(allScenarioNames(), ","), "comma-separated scenarios (direct is always run as the baseline)")
	out := fs.String("out", "", "directory for results.json, results.svg and profiles (default bench/out in the repository)")
	quick := fs.Bool("quick", false, "short run: 1s measurements, 2000 idle connections, whole run under a minute")
	prof := fs.Bool("profile", false, "write CPU and heap profiles of each ztunnel for the slowest scenario")
	profPhase := fs.String("profile-phase", profileHOL, "load during -profile: "+profileHOL+" (bulk stream + 1000 rps, slowest scenario) or "+profileRPS+" (1000 rps on reused connections alone, hbone-cross-node: what the CPU target measures), "+profileBulk+" (one bulk stream alone, slowest scenario: what the throughput target measures) or "+profileConn+" (connect, 1 B round trip, close in a loop, hbone-cross-node: what the connections/s target measures); implies -profile")
	bin := fs.String("ztunnel", "", "use this ztunnel binary instead of building ./cmd/ztunnel")
	peer := fs.String("peer", "", "also run every scenario with this other ztunnel binary (e.g. upstream's, built with --features testing) and report it beside this tree's")
	mixed := fs.String("mixed", "", "with -peer: also run hbone-cross-node with one node this tree's ztunnel and the other the peer, both ways round (interop); the value is a plug-in CA directory (ca-cert.pem, ca-key.pem, root-cert.pem) holding the root the peer's FAKE_CA signs with")
	phases := fs.String("phases", strings.Join(allPhases, ","), "comma-separated measurements each scenario runs; the others' figures stay zero and their targets \"not measured\"")
	idle := fs.Int("idle-conns", 0, "idle connections for the memory-per-connection figure (default 10000, 2000 with -quick)")
	inter := fs.Int("interleave", 0, "with -peer: after the scenarios, this many rounds on hbone-cross-node alternating between ours and the peer (2 s of the connection loop, 2 s of 1000 rps, 2 s of one bulk stream and 2 s of 1000 rps beside a full-rate one, each side), reported as paired ratios (an A/B of two builds in one run)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg := config{duration: *dur, outDir: *out, quick: *quick, profile: *prof || set["profile-phase"], profilePhase: *profPhase,
		binary: *bin, peer: *peer, mixedCA: *mixed, idleConns: *idle, rate: defaultRate, prefix: "zb", holTargetPhase: holTargetPhase,
		interleave: *inter, interleaveSlice: interleaveSlice}
	if !slices.Contains([]string{profileHOL, profileRPS, profileBulk, profileConn}, cfg.profilePhase) {
		return config{}, fmt.Errorf("-profile-phase %q: want %s, %s, %s or %s", cfg.profilePhase, profileHOL, profileRPS, profileBulk, profileConn)
	}
	if cfg.quick && !set["duration"] {
		cfg.duration = quickDuration
	}
	if cfg.idleConns == 0 {
		cfg.idleConns = defaultIdleConns
		if cfg.quick {
			cfg.idleConns = quickIdleConns
		}
	}
	if cfg.duration < 50*time.Millisecond || cfg.duration > 10*time.Minute {
		return config{}, fmt.Errorf("-duration %v: want between 50ms and 10m", cfg.duration)
	}
	if cfg.idleConns < 1 || cfg.idleConns > 100000 {
		return config{}, fmt.Errorf("-idle-conns %d: want 1..100000", cfg.idleConns)
	}
	if cfg.interleave < 0 || cfg.interleave > 500 {
		return config{}, fmt.Errorf("-interleave %d: want 0..500", cfg.interleave)
	}
	if cfg.interleave > 0 && *peer == "" {
		return config{}, errors.New("-interleave needs -peer: the other ztunnel of the pairs")
	}
	var err error
	if cfg.peer != "" {
		if err := checkPeer(cfg.peer); err != nil {
			return config{}, err
		}
	}
	if cfg.mixedCA != "" {
		if cfg.peer == "" {
			return config{}, errors.New("-mixed needs -peer: the other ztunnel of the mixed runs")
		}
		if err := checkMixedCA(cfg.mixedCA); err != nil {
			return config{}, err
		}
	}
	if cfg.scenarios, err = parseScenarios(*scen); err != nil {
		return config{}, err
	}
	if cfg.phases, err = parsePhases(*phases); err != nil {
		return config{}, err
	}
	return cfg, nil
}

func allScenarioNames() []string {
	var ns []string
	for _, d := range scenarioDefs {
		ns = append(ns, d.name)
	}
	return ns
}

// parseScenarios validates a comma list; direct is added first if missing.
func parseScenarios(s string) ([]string, error) {
	out := []string{scDirect}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" || name == scDirect {
			continue
		}
		if _, ok := findScenario(name); !ok {
			return nil, fmt.Errorf("-scenarios: unknown %q (want some of %s)", name, strings.Join(allScenarioNames(), ", "))
		}
		for _, have := range out {
			if have == name {
				return nil, fmt.Errorf("-scenarios: %q given twice", name)
			}
		}
		out = append(out, name)
	}
	return out, nil
}

// run does the whole measurement: build, topology, scenarios, optional
// profile, outputs. Everything it created is removed before it returns.
func run(ctx context.Context, cfg config, stdout, progress io.Writer) (_ *Results, err error) {
	began := time.Now()
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root: it creates network namespaces, veth pairs and iptables rules (try: sudo go run ./bench)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil, errors.New("iptables is not installed (scripts/test installs it)")
	}
	// Harness: a client and a server socket per idle connection; the
	// ztunnel children inherit the limit and need up to two per connection.
	limit, err := raiseNofile(uint64(2*cfg.idleConns + 4*fdReserve))
	if err != nil {
		return nil, err
	}
	var notes []string
	if fit := idleFit(limit); fit < cfg.idleConns {
		if fit < 100 {
			return nil, fmt.Errorf("RLIMIT_NOFILE is %d and cannot be raised: too low for the idle-connection phase", limit)
		}
		n := fmt.Sprintf("RLIMIT_NOFILE hard limit %d cannot be raised here (no CAP_SYS_RESOURCE): idle phase uses %d connections instead of %d", limit, fit, cfg.idleConns)
		fmt.Fprintf(progress, "bench: WARNING: %s\n", n)
		notes = append(notes, n)
		cfg.idleConns = fit
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	if cfg.outDir == "" {
		cfg.outDir = filepath.Join(root, "bench", "out")
	}
	if err := os.MkdirAll(cfg.outDir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: create %s: %w", cfg.outDir, err)
	}
	tmp, err := os.MkdirTemp("", "ztunnel-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	log := func(format string, a ...any) { fmt.Fprintf(progress, "bench: "+format+"\n", a...) }
	bin := cfg.binary
	if bin == "" {
		log("building ./cmd/ztunnel")
		if bin, err = buildZtunnel(ctx, root, tmp); err != nil {
			return nil, err
		}
	}
	log("building the cluster: 2 nodes, 5 pods, a ztunnel per node (RLIMIT_NOFILE %d)", limit)
	mesh, servers, err := buildTopology(ctx, cfg, bin, filepath.Join(tmp, "mesh"))
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
		if err != nil {
			saveLogs(mesh, cfg.outDir, progress)
		}
		mesh.Close()
		log("cleaned up: ztunnels stopped, namespaces, veths, iptables rules and temp files removed")
	}()
	var peer *peerRun
	if cfg.peer != "" {
		if peer, err = startPeer(ctx, cfg, tmp, progress); err != nil {
			return nil, err
		}
		defer func() { peer.close(err != nil, progress) }()
	}
	r := &runner{cfg: cfg, mesh: mesh, servers: servers, log: progress}
	res := &Results{
		Machine: machineInfo(),
		Config: RunConfig{DurationSeconds: cfg.duration.Seconds(), Quick: cfg.quick, RateRPS: cfg.rate, MessageBytes: msgSize,
			LatencyConns: latencyConns, IdleConns: cfg.idleConns, Scenarios: cfg.scenarios, Phases: cfg.phases},
		Notes: []string{
			"Shared, noisy machine: compare ratios within one run, not absolute figures across runs.",
			"Cost figures (cpu, rss, bytes_per_idle_conn) are the worst ztunnel on the path; for direct, idle ztunnels not on the path.",
			"latency_us: open loop, 1 KiB request and response on reused connections, measured from each request's scheduled send time.",
		},
	}
	res.Notes = append(res.Notes, notes...)
	if os.Getenv(relayModeEnv) == relayModeGoroutines {
		res.Notes = append(res.Notes, "relay yardsticks on Go's poller, a goroutine per direction ("+relayModeEnv+"="+relayModeGoroutines+"), not one epoll loop")
	}
	ml := &res.Machine.MachineLoad
	var waited time.Duration
	if ml.LoadStart, waited, err = settle(ctx, cfg.quick, log); err != nil {
		return nil, err
	}
	ml.SettleWait = waited.Seconds()
	ml.LagStart = probeLag(ctx, cfg.rate)
	log("machine at start: %.2f runnable tasks, %.2f cores busy (1-min load average %.2f); harness send lag p50 %.0fµs p99 %.0fµs",
		ml.LoadStart.Runnable, ml.LoadStart.CPUBusy, ml.LoadStart.LoadAvg1, ml.LagStart.P50, ml.LagStart.P99)
	for _, name := range cfg.scenarios {
		d, _ := findScenario(name)
		sr, err := r.run(ctx, d)
		if err != nil {
			return nil, err
		}
		sr.Ztunnel = ourLabel
		res.Scenarios = append(res.Scenarios, sr)
		if peer != nil && name != scDirect && !d.relays { // no ztunnel on these paths: the run's ones serve both
			ps, err := peer.run(ctx, d)
			if err != nil {
				return nil, err
			}
			res.PeerScenarios = append(res.PeerScenarios, ps)
		}
	}
	if peer != nil {
		res.Peer = peer.label + " (" + peer.path + ")"
		res.Notes = append(res.Notes, peer.r.notes...)
	}
	if cfg.interleave > 0 {
		if res.Interleave, err = interleave(ctx, r, peer.r, cfg.interleave, cfg.interleaveSlice, log); err != nil {
			return nil, err
		}
		line := interleaveLine(res.Interleave, peer.label)
		log("%s", line)
		res.Notes = append(res.Notes, line)
	}
	if cfg.mixedCA != "" {
		if res.MixedScenarios, err = runMixed(ctx, cfg, tmp, bin, progress); err != nil {
			return nil, err
		}
	}
	if ml.LoadEnd, err = sampleLoad(ctx); err != nil {
		return nil, err
	}
	ml.LagEnd = probeLag(ctx, cfg.rate)
	log("machine at end: %.2f runnable tasks, %.2f cores busy (1-min load average %.2f); harness send lag p50 %.0fµs p99 %.0fµs",
		ml.LoadEnd.Runnable, ml.LoadEnd.CPUBusy, ml.LoadEnd.LoadAvg1, ml.LagEnd.P50, ml.LagEnd.P99)
	d, _ := byName(res.Scenarios, scDirect)
	ml.judgeBusy(d.Latency.P99)
	for _, why := range ml.BusyReasons {
		log("WARNING: machine busy: %s", why)
		res.Notes = append(res.Notes, "machine busy: "+why)
	}
	res.Notes = append(res.Notes, r.notes...)
	flagImplausible(res.Scenarios)
	res.Targets = targets(res.Scenarios, cfg.phases)
	if len(res.PeerScenarios) > 0 {
		// The peer's ratios use this run's direct, like ours.
		d, _ := byName(res.Scenarios, scDirect)
		all := append([]ScenarioResult{d}, res.PeerScenarios...)
		flagImplausible(all)
		copy(res.PeerScenarios, all[1:])
		for _, name := range []string{scRelayPair, scSealedRelayPair} {
			if y, ok := byName(res.Scenarios, name); ok {
				all = append(all, y) // the same yardsticks for both
			}
		}
		res.PeerTargets = targets(all, cfg.phases)
	}
	markBusy(res.Targets, ml.Busy)
	markBusy(res.PeerTargets, ml.Busy)
	if cfg.profile {
		if name, ok := profiled(res.Scenarios, cfg.profilePhase); ok {
			d, _ := findScenario(name)
			secs := int(max(3*time.Second, min(30*time.Second, 2*cfg.duration)) / time.Second)
			files, err := r.profile(ctx, d, cfg.profilePhase, cfg.outDir, secs)
			if err != nil {
				return nil, err
			}
			res.Profiles = files
		} else {
			log("-profile: no meshed scenario was run; nothing to profile")
		}
	}
	res.Config.WallSeconds = time.Since(began).Seconds()
	jsonPath, err := writeJSON(cfg.outDir, res)
	if err != nil {
		return nil, err
	}
	svgPath, err := writeSVG(cfg.outDir, res)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(stdout)
	printTable(stdout, res)
	fmt.Fprintf(stdout, "\nwrote %s and %s", jsonPath, svgPath)
	for _, f := range res.Profiles {
		fmt.Fprintf(stdout, ", %s", filepath.Base(f))
	}
	fmt.Fprintf(stdout, "\nwall time %.1fs; machine: %s, %d cores, %s (shared and noisy: compare ratios within a run)\n",
		res.Config.WallSeconds, res.Machine.CPUModel, res.Machine.Cores, res.Machine.Kernel)
	for _, why := range ml.BusyReasons {
		fmt.Fprintf(stdout, "WARNING: machine busy: %s: the figures are worse than this machine's best\n", why)
	}
	if cfg.quick && !cfg.profile && cfg.peer == "" && time.Since(began)-waited > quickBudget {
		log("warning: -quick took %.0fs, over its %v budget", time.Since(began).Seconds(), quickBudget)
	}
	return res, nil
}
