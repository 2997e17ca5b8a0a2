package main

import (
	"context"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stream returns the first n bytes of the pattern stream.
func stream(n int) []byte {
	b := make([]byte, 0, n)
	for off := 0; off < n; {
		k := min(maxChunk, n-off)
		b = append(b, patternAt(int64(off), k)...)
		off += k
	}
	return b
}

func TestChecker(t *testing.T) {
	good := stream(3*patternPeriod + 12345)
	flipped := slices.Clone(good)
	flipped[100000] ^= 1
	dup := append(slices.Clone(good[:8192]), good[4096:]...)      // a 4 KiB chunk repeated
	dropped := append(slices.Clone(good[:8192]), good[12288:]...) // a 4 KiB chunk lost
	cases := []struct {
		name    string
		data    []byte
		chunk   int
		wantBad int64
	}{
		{"intact, odd chunks", good, 7777, -1},
		{"intact, one big read", good, len(good), -1},
		{"one flipped bit", flipped, 4096, 100000},
		{"repeated chunk", dup, 4096, 8192},
		{"lost chunk", dropped, 1500, 8192},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker()
			for b := tc.data; len(b) > 0; {
				n := min(tc.chunk, len(b))
				c.check(b[:n])
				b = b[n:]
			}
			if c.bad != tc.wantBad {
				t.Fatalf("first bad offset %d, want %d", c.bad, tc.wantBad)
			}
			if c.off != int64(len(tc.data)) {
				t.Fatalf("counted %d bytes, want %d", c.off, len(tc.data))
			}
			if (c.err() == nil) != (tc.wantBad < 0) {
				t.Fatalf("err() = %v", c.err())
			}
		})
	}
}

func TestRequestCarriesSequence(t *testing.T) {
	a, b := make([]byte, msgSize), make([]byte, msgSize)
	request(a, 1)
	request(b, 2)
	if slices.Equal(a, b) {
		t.Fatal("requests 1 and 2 are identical: a stale response would pass")
	}
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 1000; i >= 1; i-- { // unsorted on purpose
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	got := summarize(ds)
	want := Latency{P50: 500, P90: 900, P99: 990, P999: 999, Max: 1000, Count: 1000}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if (summarize(nil) != Latency{}) {
		t.Fatal("empty input must give zeros")
	}
}

func TestParseStatCPU(t *testing.T) {
	cases := []struct {
		name, stat string
		want       time.Duration
		wantErr    bool
	}{
		{"plain", "42 (ztunnel) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 2 3", 3 * time.Second, false},
		{"name with space and paren", "42 (zt ) x) R 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 9 0", 30 * time.Millisecond, false},
		{"truncated", "42 (ztunnel) S 1 42", 0, true},
		{"no name", "garbage", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU(tc.stat)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %v, %v; want %v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestCPUSpent: the threads' exact figure is used unless exited threads
// took more than two ticks with them.
func TestCPUSpent(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name             string
		t0, t1, th0, th1 time.Duration
		exact            bool
		want             time.Duration
	}{
		{"exact under a tick", 100 * ms, 100 * ms, 101 * ms, 107 * ms, true, 6 * ms},
		{"exact, ticks rounded up", 100 * ms, 130 * ms, 95 * ms, 112 * ms, true, 17 * ms},
		{"a thread exited with 50 ms", 100 * ms, 160 * ms, 100 * ms, 110 * ms, true, 60 * ms},
		{"no schedstat", 100 * ms, 110 * ms, 0, 0, false, 10 * ms},
		{"never negative", 100 * ms, 100 * ms, 110 * ms, 105 * ms, true, 0},
	}
	for _, tc := range cases {
		if got := cpuSpent(tc.t0, tc.t1, tc.th0, tc.th1, tc.exact); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestThreadsCPU reads this process's threads: what a busy loop spent
// shows up, to well under a tick, and agrees with the tick count.
func TestThreadsCPU(t *testing.T) {
	pid := os.Getpid()
	th0, ok := threadsCPU(pid)
	if !ok {
		t.Skip("bench: no /proc/<pid>/task/*/schedstat on this kernel: CPU figures fall back to ticks")
	}
	// Spin until this thread has run 30 ms (its own CPU clock, not the
	// wall clock: with other test packages on the 2 CPUs a 30 ms wall-clock
	// loop got 18 ms of CPU).
	runtime.LockOSThread() // the loop's time stays on one live thread
	threadNow := func() time.Duration {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ts.Nano())
	}
	for begin, deadline := threadNow(), time.Now().Add(10*time.Second); threadNow()-begin < 30*time.Millisecond && time.Now().Before(deadline); {
	}
	runtime.UnlockOSThread()
	th1, _ := threadsCPU(pid)
	if d := th1 - th0; d < 29*time.Millisecond || d > time.Second {
		t.Fatalf("a busy loop of 30 ms on one thread's CPU clock: threads' CPU moved %v", d)
	}
	ticks, err := processCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if diff := ticks - th1; diff < -20*time.Millisecond || diff > time.Second {
		t.Errorf("ticks %v against threads %v", ticks, th1)
	}
}

func TestParseStatusKB(t *testing.T) {
	status := "Name:\tztunnel\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n"
	if got, err := parseStatusKB(status, "VmRSS"); err != nil || got != 12345<<10 {
		t.Fatalf("VmRSS: %d, %v", got, err)
	}
	if _, err := parseStatusKB(status, "Threads"); err == nil {
		t.Fatal("a line without kB must be an error")
	}
	if _, err := parseStatusKB(status, "VmSwap"); err == nil {
		t.Fatal("a missing line must be an error")
	}
}

// TestResetPeakRSS: after a 32 MiB spike is gone, VmHWM still holds it
// until resetPeakRSS, and then no longer (the peak figure of a phase must
// not carry an earlier phase's).
func TestResetPeakRSS(t *testing.T) {
	const spike = 32 << 20
	pid := os.Getpid()
	m, err := unix.Mmap(-1, 0, spike, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(m); i += 4096 {
		m[i] = 1
	}
	if err := unix.Munmap(m); err != nil {
		t.Fatal(err)
	}
	f, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	if f.hwm < f.rss+spike/2 || f.anon <= 0 || f.anon > f.rss {
		t.Fatalf("before reset: %+v, want VmHWM ≥ VmRSS + 16 MiB and 0 < RssAnon ≤ VmRSS", f)
	}
	if err := resetPeakRSS(pid); err != nil {
		t.Fatal(err)
	}
	g, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	if g.hwm >= f.hwm-spike/2 {
		t.Fatalf("after reset VmHWM %d, before %d: want the 32 MiB spike gone", g.hwm, f.hwm)
	}
}

func TestSumMetric(t *testing.T) {
	text := []byte(`# HELP istio_tcp_connections_opened_total x
istio_tcp_connections_opened_total{reporter="source",a="}"} 3
istio_tcp_connections_opened_total{reporter="destination"} 4
istio_tcp_connections_opened_total_extra 100
go_memstats_heap_inuse_bytes 1.5e+06
`)
	cases := []struct {
		name   string
		metric string
		want   float64
		found  bool
	}{
		{"labelled samples add up", "istio_tcp_connections_opened_total", 7, true},
		{"no labels, exponent", "go_memstats_heap_inuse_bytes", 1.5e6, true},
		{"absent", "go_goroutines", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, found := sumMetric(text, tc.metric)
			if got != tc.want || found != tc.found {
				t.Fatalf("got %v %v, want %v %v", got, found, tc.want, tc.found)
			}
		})
	}
}

func TestParseEstablished(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue
   0: 0200F40A:A1B2 0202F40A:3AA0 01 00000000:00000000 00:00000000 00000000
   1: 0200F40A:A1B3 0202F40A:3AA0 06 00000000:00000000 00:00000000 00000000
   2: 0200F40A:A1B4 0202F40A:1B59 01 00000000:00000000 00:00000000 00000000
   3: 0200F40A:A1B5 0302F40A:3AA0 01 00000000:00000000 00:00000000 00000000
`)
	if got := parseEstablished(table, 15008); got != 2 {
		t.Fatalf("got %d established to 15008, want 2", got)
	}
}

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name      string
		args      []string
		duration  time.Duration
		idle      int
		scenarios []string
		wantErr   string
	}{
		{"defaults", nil, 5 * time.Second, defaultIdleConns, []string{scDirect, scRelayPair, scSealedRelayPair, scCrossNode, scSameNode, scPassthrough}, ""},
		{"quick", []string{"-quick"}, quickDuration, quickIdleConns, []string{scDirect, scRelayPair, scSealedRelayPair, scCrossNode, scSameNode, scPassthrough}, ""},
		{"quick keeps an explicit duration", []string{"-quick", "-duration", "3s"}, 3 * time.Second, quickIdleConns, []string{scDirect, scRelayPair, scSealedRelayPair, scCrossNode, scSameNode, scPassthrough}, ""},
		{"direct is always first", []string{"-scenarios", "tcp-passthrough, direct"}, 5 * time.Second, defaultIdleConns, []string{scDirect, scPassthrough}, ""},
		{"unknown scenario", []string{"-scenarios", "hbone"}, 0, 0, nil, "unknown"},
		{"repeated scenario", []string{"-scenarios", "hbone-same-node,hbone-same-node"}, 0, 0, nil, "twice"},
		{"duration too short", []string{"-duration", "1ms"}, 0, 0, nil, "-duration"},
		{"stray argument", []string{"now"}, 0, 0, nil, "unexpected"},
		{"unknown profile phase", []string{"-profile-phase", "nope"}, 0, 0, nil, "-profile-phase"},
		{"peer that does not exist", []string{"-peer", "/nonexistent/ztunnel"}, 0, 0, nil, "-peer"},
		{"peer that is a directory", []string{"-peer", "/"}, 0, 0, nil, "not an executable"},
		{"mixed without a peer", []string{"-mixed", "/tmp"}, 0, 0, nil, "-mixed needs -peer"},
		{"mixed without a CA", []string{"-peer", "/bin/sh", "-mixed", "/nonexistent"}, 0, 0, nil, "-mixed /nonexistent"},
		{"interleave without a peer", []string{"-interleave", "10"}, 0, 0, nil, "-interleave needs -peer"},
		{"interleave out of range", []string{"-peer", "/bin/sh", "-interleave", "-1"}, 0, 0, nil, "-interleave -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlagsQuiet(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.duration != tc.duration || cfg.idleConns != tc.idle || !slices.Equal(cfg.scenarios, tc.scenarios) || cfg.profile || cfg.profilePhase != profileHOL {
				t.Fatalf("got %v %d %v", cfg.duration, cfg.idleConns, cfg.scenarios)
			}
		})
	}
}

// parseFlagsQuiet is parseFlags without usage output on stderr.
func parseFlagsQuiet(args []string) (config, error) {
	stderr := os.Stderr
	null, err := os.Open(os.DevNull)
	if err == nil {
		os.Stderr = null
		defer func() { os.Stderr = stderr; null.Close() }()
	}
	return parseFlags(args)
}

// TestPhasesFlag: -phases keeps the phases given, in the order they run,
// defaults to all of them, and refuses names it does not know.
func TestPhasesFlag(t *testing.T) {
	cases := []struct {
		arg     string
		want    phaseSet
		wantErr string
	}{
		{"", nil, "empty"},
		{"bulk, hol", phaseSet{phHOL, phBulk}, ""},
		{"idle,latency,idle", phaseSet{phLatency, phIdle}, ""},
		{"hol,throughput", nil, `unknown "throughput"`},
	}
	cfg, err := parseFlagsQuiet(nil)
	if err != nil || !slices.Equal(cfg.phases, allPhases) {
		t.Fatalf("default phases %v, %v; want %v", cfg.phases, err, allPhases)
	}
	for _, tc := range cases {
		cfg, err := parseFlagsQuiet([]string{"-phases", tc.arg})
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("-phases %q: error %v, want one containing %q", tc.arg, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(cfg.phases, tc.want) {
			t.Errorf("-phases %q: %v, %v; want %v", tc.arg, cfg.phases, err, tc.want)
		}
	}
}

func TestIdleFit(t *testing.T) {
	if got := idleFit(20000); got != (20000-fdReserve)/2 {
		t.Fatalf("idleFit(20000) = %d", got)
	}
	if idleFit(100) != 0 {
		t.Fatal("a limit below the reserve fits nothing")
	}
}

func TestImplausible(t *testing.T) {
	loop := Latency{P50: 200, Count: 200}
	cases := []struct {
		name   string
		open   Latency
		loop   Latency
		factor float64
		want   bool
	}{
		{"within the factor", Latency{P50: 390, Count: 1000}, loop, 2, false},
		{"a backlog (issue #14: 182 ms)", Latency{P50: 182000, Count: 1000}, loop, 2, true},
		{"no loop samples: no verdict", Latency{P50: 182000, Count: 1000}, Latency{}, 2, false},
		{"reused phase: a cold 4 × is normal", Latency{P50: 140, Count: 1000}, Latency{P50: 35, Count: 200}, 10, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := implausible("latency_new_conn_us", tc.open, tc.loop, tc.factor); (got != "") != tc.want {
				t.Fatalf("implausible = %q, want flagged %v", got, tc.want)
			}
		})
	}
}

func TestFlagImplausible(t *testing.T) {
	rs := []ScenarioResult{
		{Name: scDirect, Implausible: []string{implausible("latency_new_conn_us", Latency{P50: 182000, Count: 1}, Latency{P50: 200, Count: 1}, 2)}},
		{Name: scCrossNode},
	}
	flagImplausible(rs)
	if implausibleMark(rs[1], "latency_new_conn_us") != "!" || implausibleMark(rs[1], "latency_us") != "" || len(rs[0].Implausible) != 1 {
		t.Fatalf("flags: %+v", rs)
	}
	var b strings.Builder
	printTable(&b, &Results{Scenarios: rs})
	if !strings.Contains(b.String(), "! IMPLAUSIBLE direct latency_new_conn_us") {
		t.Fatalf("table does not flag it:\n%s", b.String())
	}
}

func TestParseLoad(t *testing.T) {
	r, a, err := parseLoadavg("0.52 0.58 0.59 3/345 6789\n")
	if err != nil || r != 3 || a != 0.52 {
		t.Fatalf("parseLoadavg: %v %v %v", r, a, err)
	}
	if _, _, err := parseLoadavg("0.52 0.58"); err == nil {
		t.Fatal("short /proc/loadavg must be an error")
	}
	busy, total, err := parseCPUStat("cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil || busy != 170 || total != 990 {
		t.Fatalf("parseCPUStat: busy %d total %d %v", busy, total, err)
	}
	if _, _, err := parseCPUStat("intr 1 2 3"); err == nil {
		t.Fatal("a /proc/stat without the cpu line first must be an error")
	}
}

func TestJudgeBusy(t *testing.T) {
	cores := float64(runtime.NumCPU())
	calm := LoadSample{Runnable: 0.1}
	loaded := LoadSample{Runnable: cores, CPUBusy: cores}
	cases := []struct {
		name      string
		m         MachineLoad
		directP99 float64
		reasons   int
	}{
		{"calm", MachineLoad{LoadStart: calm, LagStart: Latency{P99: 100}, LagEnd: Latency{P99: 150}}, 300, 0},
		{"loaded at start", MachineLoad{LoadStart: loaded, LagStart: Latency{P99: 100}}, 300, 1},
		// What a Go sampler reads on idle cores: about one runnable task
		// more than there is, and no CPU in use.
		{"runnable but idle CPUs", MachineLoad{LoadStart: LoadSample{Runnable: cores, CPUBusy: 0.03}, LagStart: Latency{P99: 100}}, 300, 0},
		{"CPUs in use, nothing queued", MachineLoad{LoadStart: LoadSample{Runnable: 0.2, CPUBusy: cores}, LagStart: Latency{P99: 100}}, 300, 0},
		{"lag at the end beyond direct's p99", MachineLoad{LoadStart: calm, LagEnd: Latency{P99: 5000}}, 300, 1},
		{"both", MachineLoad{LoadStart: loaded, LagStart: Latency{P99: 5000}}, 300, 2},
		{"no direct: lag not judged", MachineLoad{LoadStart: calm, LagStart: Latency{P99: 5000}}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.m.judgeBusy(tc.directP99)
			if len(tc.m.BusyReasons) != tc.reasons || tc.m.Busy != (tc.reasons > 0) {
				t.Fatalf("busy %v, reasons %q", tc.m.Busy, tc.m.BusyReasons)
			}
		})
	}
}

func TestProbeLag(t *testing.T) {
	l := probeLag(context.Background(), 1000)
	if l.Count != int(lagProbe/time.Millisecond) || l.P50 <= 0 {
		t.Fatalf("probeLag: %+v", l)
	}
}

func TestParseSwitches(t *testing.T) {
	v, nv := parseCtxSwitches("Name:\tztunnel\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n")
	if v != 120 || nv != 7 {
		t.Fatalf("ctxt switches %d %d", v, nv)
	}
	if n := parseIOSyscalls("rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 5\nread_bytes: 0\n"); n != 15 {
		t.Fatalf("syscalls %d", n)
	}
	s, err := processSwitches(os.Getpid())
	if err != nil || s.Voluntary+s.Nonvoluntary <= 0 || s.Syscalls <= 0 {
		t.Fatalf("own process: %+v, %v", s, err)
	}
}

func TestProfilePhaseFlag(t *testing.T) {
	cfg, err := parseFlagsQuiet([]string{"-profile-phase", profileRPS})
	if err != nil || !cfg.profile || cfg.profilePhase != profileRPS {
		t.Fatalf("-profile-phase rps: profile %v phase %q, %v", cfg.profile, cfg.profilePhase, err)
	}
	rs := []ScenarioResult{
		{Name: scDirect},
		{Name: scCrossNode, ZtunnelsOnPath: true, Throughput1: 3},
		{Name: scSameNode, ZtunnelsOnPath: true, Throughput1: 1},
	}
	if name, _ := profiled(rs, profileRPS); name != scCrossNode {
		t.Fatalf("rps profiles %s, want the CPU target's scenario", name)
	}
	if name, _ := profiled(rs, profileHOL); name != scSameNode {
		t.Fatalf("hol profiles %s, want the slowest", name)
	}
	if name, _ := profiled(rs, profileConn); name != scCrossNode {
		t.Fatalf("conn profiles %s, want the connections/s target's scenario", name)
	}
	if name, _ := profiled(rs, profileBulk); name != scSameNode {
		t.Fatalf("bulk profiles %s, want the slowest", name)
	}
	if cfg, err := parseFlagsQuiet([]string{"-profile-phase", profileBulk}); err != nil || cfg.profilePhase != profileBulk {
		t.Fatalf("-profile-phase bulk: phase %q, %v", cfg.profilePhase, err)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestSlotsDue: an exact schedule keeps its period; a jittered one keeps
// each request in its own slot but spreads the requests over the whole
// slot, so no phase against a periodic kernel tick is favoured.
func TestSlotsDue(t *testing.T) {
	const interval = time.Millisecond
	exact, jittered := slots{interval: interval}, slots{interval: interval, jitter: true}
	var deciles [10]int
	for i := range 5000 {
		if got, want := exact.due(i), time.Duration(i)*interval; got != want {
			t.Fatalf("exact due(%d) = %v, want %v", i, got, want)
		}
		off := jittered.due(i) - time.Duration(i)*interval
		if off < 0 || off >= interval {
			t.Fatalf("jittered due(%d) is %v into its slot, outside [0, %v)", i, off, interval)
		}
		deciles[off*10/interval]++
	}
	for k, n := range deciles {
		if n < 400 || n > 600 {
			t.Fatalf("jittered offsets: decile %d holds %d of 5000 (want ~500): %v", k, n, deciles)
		}
	}
}

// TestSummarizePairs: ratios and wins are taken round by round (not from
// the medians), rounds where ours measured zero stay out of the ratio, and
// the callers' slices keep their round order.
func TestSummarizePairs(t *testing.T) {
	ours := []float64{100, 200, 0, 400}
	peer := []float64{110, 180, 50, 480}
	s := summarizePairs(ours, peer)
	// Ratios 1.1, 0.9, 1.2 (the zero round left out): median 1.1.
	if math.Abs(s.RatioMedian-1.1) > 1e-9 || s.PeerHigher != 3 || s.Rounds != 4 {
		t.Errorf("ratio median %v, peer higher %d, rounds %d; want 1.1, 3, 4", s.RatioMedian, s.PeerHigher, s.Rounds)
	}
	if s.OursMedian != 150 || s.PeerMedian != 145 {
		t.Errorf("medians %v / %v, want 150 / 145", s.OursMedian, s.PeerMedian)
	}
	if !slices.Equal(ours, []float64{100, 200, 0, 400}) || !slices.Equal(peer, []float64{110, 180, 50, 480}) {
		t.Errorf("inputs reordered: %v %v", ours, peer)
	}
}
