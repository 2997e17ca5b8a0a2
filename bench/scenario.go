package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/demo"
)

// Scenario names, as in results.json.
const (
	scDirect      = "direct"
	scCrossNode   = "hbone-cross-node"
	scSameNode    = "hbone-same-node"
	scPassthrough = "tcp-passthrough"
	scRelayPair   = "relay-pair" // the yardstick: two bare relays (relay.go)
	// The second yardstick: the same relays, their leg sealed with
	// AES-GCM records (relayseal.go).
	scSealedRelayPair = "sealed-relay-pair"
)

// scenarioDef says who talks to whom and which ztunnels must see it.
type scenarioDef struct {
	name           string
	client, server string // pod names (see topology.go)
	// onPath are the nodes whose ztunnel carries the traffic: each must
	// count at least every connection the harness made, and the others
	// none. Empty for direct and relay-pair.
	onPath []int
	// relays: two bare relays (relay.go) carry the traffic in the
	// ztunnels' places; the cost figures are theirs. sealed: the leg
	// between them is sealed (relayseal.go).
	relays, sealed bool
}

var scenarioDefs = []scenarioDef{
	{name: scDirect, client: podPlain, server: podOutside},
	{name: scRelayPair, client: podPlain, server: podOutside, relays: true},
	{name: scSealedRelayPair, client: podPlain, server: podOutside, relays: true, sealed: true},
	{name: scCrossNode, client: podClient, server: podRemote, onPath: []int{1, 2}},
	{name: scSameNode, client: podClient, server: podLocal, onPath: []int{1}},
	{name: scPassthrough, client: podClient, server: podOutside, onPath: []int{1}},
}

func findScenario(name string) (scenarioDef, bool) {
	for _, d := range scenarioDefs {
		if d.name == name {
			return d, true
		}
	}
	return scenarioDef{}, false
}

// costNodes are the ztunnels whose CPU and memory a scenario reports: the
// ones on its path, or (direct) every node, idle, as the floor; for
// relay-pair, the nodes whose places its relays take.
func (d scenarioDef) costNodes(all int) []int {
	if len(d.onPath) > 0 {
		return d.onPath
	}
	ns := make([]int, all)
	for i := range ns {
		ns[i] = i + 1
	}
	return ns
}

// ZtunnelCost is one ztunnel's cost in one scenario.
type ZtunnelCost struct {
	Node int `json:"node"`
	// CPUVCPU is CPU seconds per second (= per 1000 requests) during the
	// 1000 rps reused-connection phase.
	CPUVCPU float64 `json:"cpu_vcpu_per_1000rps"`
	// RSSMB is the peak VmRSS during that phase (VmHWM after a reset at
	// its start), MiB: the target's figure. RSSMedianMB is the median of
	// VmRSS sampled each second and RSSAnonMB the peak of the samples'
	// anonymous part (RssAnon): the peak also
	// holds the executable's clean file pages that a burst of connection
	// set-ups and teardowns maps (each page fault on the binary maps up to
	// 16 neighbouring pages) until ztunnel's next text trim.
	RSSMB       float64 `json:"rss_mb"`
	RSSMedianMB float64 `json:"rss_median_mb"`
	RSSAnonMB   float64 `json:"rss_anon_mb"`
	// Per request of that phase: context switches of all its threads
	// (voluntary + nonvoluntary, and the voluntary part) and
	// read/write-family system calls.
	CtxSwitchesPerReq    float64 `json:"ctx_switches_per_req"`
	VolCtxSwitchesPerReq float64 `json:"voluntary_ctx_switches_per_req"`
	SyscallsPerReq       float64 `json:"rw_syscalls_per_req"`
	// Per connection of the connection-rate phase: CPU time (µs) and
	// context switches. The rate itself is CPU-bound here and moves with
	// the machine's steal time; CPU per connection is the steadier figure
	// to compare two ztunnels by.
	CPUPerConnUS          float64 `json:"cpu_us_per_conn"`
	CtxSwitchesPerConn    float64 `json:"ctx_switches_per_conn"`
	VolCtxSwitchesPerConn float64 `json:"voluntary_ctx_switches_per_conn"`
	// Per GB (10^9 bytes) delivered by the one-stream throughput phase:
	// CPU seconds, context switches and read/write-family syscalls. A
	// ztunnel's CPU per GB bounds its throughput (a core moves at most
	// 1/cpu GB/s), so this is where a throughput gap is read per cause.
	CPUSecPerGB      float64 `json:"cpu_s_per_gb"`
	CtxSwitchesPerGB float64 `json:"ctx_switches_per_gb"`
	SyscallsPerGB    float64 `json:"rw_syscalls_per_gb"`
	// Idle connections: VmRSS before and with them (MiB), and per connection.
	IdleRSSBeforeMB     float64 `json:"idle_rss_before_mb"`
	IdleRSSMB           float64 `json:"idle_rss_mb"`
	BytesPerIdleConn    float64 `json:"bytes_per_idle_conn"`
	HeapStackPerIdleCon float64 `json:"heap_stack_bytes_per_idle_conn"`
	FDsPerIdleConn      float64 `json:"fds_per_idle_conn"`
	ConnsCounted        float64 `json:"connections_counted"`
	OpenFilesLimit      string  `json:"open_files_limit"`
}

// ScenarioResult is one scenario's figures (results.json).
type ScenarioResult struct {
	// Ztunnel names the binary measured: ourLabel, or the -peer binary's.
	Ztunnel           string  `json:"ztunnel"`
	Name              string  `json:"name"`
	Throughput1       float64 `json:"throughput_gbps_1stream"`
	Throughput8       float64 `json:"throughput_gbps_8streams"`
	Latency           Latency `json:"latency_us"`
	ConnPerS          float64 `json:"conn_per_s"`
	CPUVCPU           float64 `json:"cpu_vcpu_per_1000rps"`
	RSSMB             float64 `json:"rss_mb"`
	RSSMedianMB       float64 `json:"rss_median_mb"` // worst ztunnel's median (see ZtunnelCost)
	RSSAnonMB         float64 `json:"rss_anon_mb"`
	CtxSwitchesPerReq float64 `json:"ctx_switches_per_req"` // worst ztunnel on the path
	CPUSecPerGB       float64 `json:"cpu_s_per_gb"`         // worst ztunnel, one-stream phase
	BytesPerIdleConn  float64 `json:"bytes_per_idle_conn"`
	LatencyNewConn    Latency `json:"latency_new_conn_us"`
	LatencyHOL        Latency `json:"latency_hol_us"`
	HOLBulkGbps       float64 `json:"hol_bulk_gbps"`
	HOLHBONEConns     int     `json:"hol_hbone_tcp_conns"`
	// HOLRatio is latency_hol_us.p99 ÷ latency_us.p99 (the head-of-line
	// target's figure; direct's is the machine's contention floor), and
	// HOLRatioP50 the same for p50: on the 2-core VM direct's p99 ratio is
	// 15-50 (rare CPU stalls while its bulk stream keeps both cores busy)
	// but its p50 ratio 1-3, so p50 shows queueing behind the bulk stream
	// more cleanly.
	HOLRatio    float64 `json:"hol_p99_ratio"`
	HOLRatioP50 float64 `json:"hol_p50_ratio"`
	// The same phase with the bulk stream's reader held to slowReaderRate:
	// the stream keeps its windows and every buffer on the shared
	// connection full while the CPUs stay mostly free, so the ratio shows
	// queueing behind it (the head-of-line target), not CPU contention.
	// The writer pauses every other half second (headOfLine): requests
	// once the stream has drained, when nothing moves on it, are the
	// unloaded reference (LatencyHOLSlowIdle) that HOLSlowRatio divides by.
	LatencyHOLSlow     Latency `json:"latency_hol_slow_reader_us"`
	LatencyHOLSlowIdle Latency `json:"latency_hol_slow_reader_idle_us"`
	// The median over the phase's half-second turns of each turn's p99,
	// with the stream moving and idle (turnSplit): HOLSlowRatio is their
	// ratio.
	HOLSlowTurnP99     float64 `json:"hol_slow_reader_turn_p99_us"`
	HOLSlowIdleTurnP99 float64 `json:"hol_slow_reader_idle_turn_p99_us"`
	HOLSlowBulkGbps    float64 `json:"hol_slow_reader_bulk_gbps"`
	HOLSlowHBONEConns  int     `json:"hol_slow_reader_hbone_tcp_conns"`
	HOLSlowRatio       float64 `json:"hol_slow_reader_p99_ratio"`
	HOLSlowRatioP50    float64 `json:"hol_slow_reader_p50_ratio"`
	// GC relates the 1000 rps phase's slowest requests to the collections
	// our ztunnels on the path ran meanwhile (gctrace.go); nil for relays
	// and a -peer.
	GC            *GCReport `json:"gc_1000rps,omitempty"`
	HarnessLag    Latency   `json:"harness_lag_us"`
	HarnessLagNew Latency   `json:"harness_lag_new_conn_us"`
	// Plain loops of the same operations, measured just before each
	// open-loop phase (selfcheck.go), and for direct the reasons its
	// figures cannot be trusted (for the others: that their ratios rest on
	// such a figure).
	LoopLatency    Latency       `json:"loop_latency_us"`
	LoopNewConn    Latency       `json:"loop_new_conn_us"`
	Implausible    []string      `json:"implausible,omitempty"`
	IdleConns      int           `json:"idle_conns"`
	Connections    int64         `json:"connections_made"`
	BytesVerified  int64         `json:"bytes_verified"`
	Ztunnels       []ZtunnelCost `json:"ztunnels"`
	ZtunnelsOnPath bool          `json:"ztunnels_on_path"`
	// Relays: the cost figures are relay-pair's two relays (relay.go), not
	// ztunnels; it has no idle-connection figures.
	Relays bool `json:"relays,omitempty"`
	// ClientMSS, ServerMSS (relays only): the TCP_MAXSEG of the client's
	// sockets and of the second relay's sockets to the server, the
	// segments those legs have on a ztunnel path (redirectedMSS).
	ClientMSS       int     `json:"client_mss,omitempty"`
	ServerMSS       int     `json:"server_mss,omitempty"`
	DurationSeconds float64 `json:"duration_s"`
}

// runner holds what every scenario shares.
type runner struct {
	cfg     config
	mesh    *demo.Mesh
	servers map[string]*podServers
	log     io.Writer
	notes   []string // for results.json
	// tag starts every progress line ("peer NAME: " for -peer).
	tag string
	// peer: the ztunnels are another binary (-peer), which may export no Go
	// runtime metrics and no Go heap profile endpoint.
	peer bool
}

func (r *runner) progress(format string, a ...any) {
	fmt.Fprintf(r.log, "bench: "+r.tag+format+"\n", a...)
}

func (r *runner) node(i int) *demo.MeshNode { return r.mesh.Nodes[i-1] }

// restartAll gives every node a fresh ztunnel process.
func (r *runner) restartAll(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(r.mesh.Nodes))
	for i, n := range r.mesh.Nodes {
		wg.Go(func() { errs[i] = n.Restart(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run measures one scenario in two parts, each on fresh ztunnel
// processes: the traffic phases, then the idle connections (so the memory
// baseline is not inflated by buffers the bulk phases left behind, and
// the head-of-line phase finds only the warm-up's HBONE connection in the
// pool). Any failure is returned; the caller stops.
func (r *runner) run(ctx context.Context, d scenarioDef) (res ScenarioResult, err error) {
	started := time.Now()
	res = ScenarioResult{Name: d.name, ZtunnelsOnPath: len(d.onPath) > 0, Relays: d.relays}
	defer func() {
		if err != nil {
			err = fmt.Errorf("scenario %s: %w", d.name, err)
		}
	}()
	p := &path{client: r.mesh.Pods[d.client].Pod, server: r.mesh.Pods[d.server].IP}
	// pidOf names the process whose costs stand for node ni's: its
	// ztunnel, looked up at each use because every part restarts them.
	pidOf := func(ni int) int { return r.node(ni).Pid() }
	if d.relays {
		client, server := r.mesh.Pods[d.client], r.mesh.Pods[d.server]
		if p.mss, err = redirectedMSS(client.Pod, server.IP); err != nil {
			return res, err
		}
		if res.ServerMSS, err = redirectedMSS(server.Pod, client.IP); err != nil {
			return res, err
		}
		res.ClientMSS = p.mss
		rp, err := startRelayPair(ctx, client.Pod, server.Pod, d.sealed, res.ServerMSS)
		if err != nil {
			return res, err
		}
		defer func() {
			// A relay that exited early fails the run even if every
			// phase got its figures.
			if serr := rp.stop(); err == nil && serr != nil {
				err = serr
			}
		}()
		p.server, p.portShift = netip.MustParseAddr("127.0.0.1"), relayPortShift
		pidOf = rp.pid
	}
	costNodes := d.costNodes(len(r.mesh.Nodes))
	costs := make([]ZtunnelCost, len(costNodes))
	for i, ni := range costNodes {
		costs[i].Node = ni
	}
	counted := map[int]float64{}
	r.progress("[%s] %s → %s", d.name, d.client, d.server)
	if p.mss > 0 {
		r.progress("[%s] the client's sockets at TCP_MAXSEG %d, as a redirected connection's segments are, and the second relay's to the server at %d, as ztunnel's inbound from the client's address", d.name, p.mss, res.ServerMSS)
	}
	ran := r.cfg.phases.has
	err = r.fresh(ctx, d, p, counted, func() error {
		if ran(phLatency) {
			if err := r.latencyPhase(ctx, p, d, costNodes, pidOf, costs, &res); err != nil {
				return err
			}
		}
		// relay-pair shares no connection between streams: nothing to
		// block the requests but the CPU, which direct's figure shows.
		if ran(phHOL) && !d.relays {
			if err := r.headOfLinePhases(ctx, p, d, &res); err != nil {
				return err
			}
		}
		if ran(phNewConn) {
			if err := r.newConnPhase(ctx, p, d, &res); err != nil {
				return err
			}
		}
		if ran(phConnRate) {
			if err := r.connRatePhase(ctx, p, d, costNodes, pidOf, costs, &res); err != nil {
				return err
			}
		}
		if ran(phBulk) {
			return r.bulkPhases(ctx, p, d, costNodes, pidOf, costs, &res)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	// The relays' memory per idle connection would be that of Go's
	// goroutines and their buffers, nothing the targets compare with.
	if ran(phIdle) && !d.relays {
		err = r.fresh(ctx, d, p, counted, func() error {
			var err error
			if res.IdleConns, err = r.idle(ctx, d.name, p, costNodes, costs); err != nil {
				return fmt.Errorf("idle connections: %w", err)
			}
			r.progress("[%s] %d idle connections: bytes/conn (RSS) %s; (Go heap+stacks) %s; fds/conn %s", d.name, res.IdleConns,
				fmtCosts(costs, func(c ZtunnelCost) float64 { return c.BytesPerIdleConn }, "%.0f"),
				fmtCosts(costs, func(c ZtunnelCost) float64 { return c.HeapStackPerIdleCon }, "%.0f"),
				fmtCosts(costs, func(c ZtunnelCost) float64 { return c.FDsPerIdleConn }, "%.2f"))
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	if d.name == scDirect {
		for _, why := range []string{
			implausible("latency_us", res.Latency, res.LoopLatency, plausibleReused),
			implausible("latency_new_conn_us", res.LatencyNewConn, res.LoopNewConn, plausibleNewConn),
		} {
			if why != "" {
				r.progress("WARNING: [%s] %s", d.name, why)
				res.Implausible = append(res.Implausible, why)
			}
		}
	}
	for i := range costs {
		costs[i].ConnsCounted = counted[costs[i].Node]
		res.CPUVCPU = math.Max(res.CPUVCPU, costs[i].CPUVCPU)
		res.RSSMB = math.Max(res.RSSMB, costs[i].RSSMB)
		res.RSSMedianMB = math.Max(res.RSSMedianMB, costs[i].RSSMedianMB)
		res.RSSAnonMB = math.Max(res.RSSAnonMB, costs[i].RSSAnonMB)
		res.CtxSwitchesPerReq = math.Max(res.CtxSwitchesPerReq, costs[i].CtxSwitchesPerReq)
		res.CPUSecPerGB = math.Max(res.CPUSecPerGB, costs[i].CPUSecPerGB)
		res.BytesPerIdleConn = math.Max(res.BytesPerIdleConn, costs[i].BytesPerIdleConn)
	}
	res.Ztunnels = costs
	res.Connections = p.dials.Load()
	res.BytesVerified = p.verified.Load()
	res.HOLRatio = holRatio(res)
	res.HOLRatioP50 = safeRatio(res.LatencyHOL.P50, res.Latency.P50)
	res.HOLSlowRatio = holSlowRatio(res)
	res.HOLSlowRatioP50 = safeRatio(res.LatencyHOLSlow.P50, res.LatencyHOLSlowIdle.P50)
	res.DurationSeconds = time.Since(started).Seconds()
	return res, nil
}

// latencyPhase measures 1000 rps on reused connections, with CPU and RSS
// sampled, and relates its slowest requests to our ztunnels' GCs.
func (r *runner) latencyPhase(ctx context.Context, p *path, d scenarioDef, costNodes []int, pidOf func(int) int, costs []ZtunnelCost, res *ScenarioResult) error {
	var err error
	if res.LoopLatency, err = p.baselineLoop(ctx, true); err != nil {
		return fmt.Errorf("loop (reused connection): %w", err)
	}
	// Our ztunnels' GC trace from here on (not a -peer's: not Go;
	// direct has no ztunnel on its path).
	var logOffs []int64
	if len(d.onPath) > 0 && !d.relays && !r.peer {
		for _, ni := range costNodes {
			logOffs = append(logOffs, logSize(r.node(ni).LogPath))
		}
	}
	lat, err := r.withCost(ctx, costNodes, pidOf, costs, func() (openLoopResult, error) {
		return p.openLoop(ctx, r.cfg.rate, r.cfg.duration, true, latencyConns)
	})
	if err != nil {
		return fmt.Errorf("latency (reused connections): %w", err)
	}
	res.Latency, res.HarnessLag = lat.latency, lat.lag
	if logOffs != nil {
		if res.GC, err = r.gcReport(costNodes, logOffs, lat); err != nil {
			return err
		}
		g := res.GC
		r.progress("[%s] GC during the %d rps phase: %d cycles on the path (%.1f ms of wall time in all); of the %d requests at or above p99, %d were in flight within %v of one (%d of %d requests in all); p99 of the requests away from every cycle %.0fµs (all: %.0fµs)",
			d.name, r.cfg.rate, g.Cycles, g.ClockMS, g.Slow, g.SlowNearGC, gcSlack, g.NearGC, lat.latency.Count, g.P99AwayFromGC, lat.latency.P99)
	}
	r.progress("[%s] latency %d rps, %d reused conns: p50 %.0fµs p99 %.0fµs p999 %.0fµs (harness send lag p50 %.0fµs p99 %.0fµs; plain loop p50 %.0fµs); vCPU %s; RSS MiB %s",
		d.name, r.cfg.rate, latencyConns, lat.latency.P50, lat.latency.P99, lat.latency.P999, lat.lag.P50, lat.lag.P99, res.LoopLatency.P50,
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.CPUVCPU }, "%.4f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.RSSMB }, "%.1f")+
			" (median "+fmtCosts(costs, func(c ZtunnelCost) float64 { return c.RSSMedianMB }, "%.1f")+
			"; anonymous peak "+fmtCosts(costs, func(c ZtunnelCost) float64 { return c.RSSAnonMB }, "%.1f")+")")
	r.progress("[%s] per request at %d rps: context switches %s (voluntary %s); read/write syscalls %s",
		d.name, r.cfg.rate,
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.CtxSwitchesPerReq }, "%.2f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.VolCtxSwitchesPerReq }, "%.2f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.SyscallsPerReq }, "%.2f"))
	return nil
}

// newConnPhase measures 1000 rps with a new connection each.
func (r *runner) newConnPhase(ctx context.Context, p *path, d scenarioDef, res *ScenarioResult) error {
	var err error
	if res.LoopNewConn, err = p.baselineLoop(ctx, false); err != nil {
		return fmt.Errorf("loop (new connections): %w", err)
	}
	nc, err := p.openLoop(ctx, r.cfg.rate, r.cfg.duration, false, newConnWorkers)
	if err != nil {
		return fmt.Errorf("latency (new connections): %w", err)
	}
	res.LatencyNewConn, res.HarnessLagNew = nc.latency, nc.lag
	r.progress("[%s] latency %d rps, a new connection each: p50 %.0fµs p99 %.0fµs (%d requests in %.2fs; send lag p50 %.0fµs p99 %.0fµs); plain loop p50 %.0fµs (%.2f×)",
		d.name, r.cfg.rate, nc.latency.P50, nc.latency.P99, nc.latency.Count, nc.elapsed.Seconds(), nc.lag.P50, nc.lag.P99,
		res.LoopNewConn.P50, nc.latency.P50/res.LoopNewConn.P50)
	return nil
}

// connRatePhase measures connections per second (connect, 1 B round
// trip, close) with the CPU and context switches per connection.
func (r *runner) connRatePhase(ctx context.Context, p *path, d scenarioDef, costNodes []int, pidOf func(int) int, costs []ZtunnelCost, res *ScenarioResult) error {
	err := r.perUnit(costNodes, pidOf, costs, func() (float64, error) {
		before := p.dials.Load()
		var err error
		res.ConnPerS, err = p.connRate(ctx, connRateWorkers, r.cfg.duration)
		return float64(p.dials.Load() - before), err
	}, func(c *ZtunnelCost, d procDelta, conns float64) {
		c.CPUPerConnUS = float64(d.cpu.Microseconds()) / conns
		c.VolCtxSwitchesPerConn = d.vol / conns
		c.CtxSwitchesPerConn = d.all / conns
	})
	if err != nil {
		return fmt.Errorf("connection rate: %w", err)
	}
	r.progress("[%s] connect + 1 B round trip + close: %.0f conn/s; per connection: CPU µs %s, context switches %s (voluntary %s)", d.name, res.ConnPerS,
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.CPUPerConnUS }, "%.0f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.CtxSwitchesPerConn }, "%.2f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.VolCtxSwitchesPerConn }, "%.2f"))
	return nil
}

// bulkPhases measures one stream's throughput, with its CPU, context
// switches and syscalls per GB, then eight streams'.
func (r *runner) bulkPhases(ctx context.Context, p *path, d scenarioDef, costNodes []int, pidOf func(int) int, costs []ZtunnelCost, res *ScenarioResult) error {
	err := r.perUnit(costNodes, pidOf, costs, func() (float64, error) {
		var bytes int64
		var err error
		res.Throughput1, bytes, err = p.bulk(ctx, 1, r.cfg.duration)
		return float64(bytes) / 1e9, err
	}, func(c *ZtunnelCost, d procDelta, gb float64) {
		c.CPUSecPerGB = d.cpu.Seconds() / gb
		c.CtxSwitchesPerGB = d.all / gb
		c.SyscallsPerGB = d.syscalls / gb
	})
	if err != nil {
		return fmt.Errorf("throughput 1 stream: %w", err)
	}
	if res.Throughput8, _, err = p.bulk(ctx, 8, r.cfg.duration); err != nil {
		return fmt.Errorf("throughput 8 streams: %w", err)
	}
	r.progress("[%s] throughput: 1 stream %.2f Gbit/s, 8 streams %.2f Gbit/s; per GB on 1 stream: CPU s %s, context switches %s, read/write syscalls %s",
		d.name, res.Throughput1, res.Throughput8,
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.CPUSecPerGB }, "%.2f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.CtxSwitchesPerGB }, "%.0f"),
		fmtCosts(costs, func(c ZtunnelCost) float64 { return c.SyscallsPerGB }, "%.0f"))
	return nil
}

// headOfLinePhases measures 1 KiB requests beside a bulk stream with a
// slow reader, then beside one at full rate, into res.
func (r *runner) headOfLinePhases(ctx context.Context, p *path, d scenarioDef, res *ScenarioResult) error {
	// Head-of-line runs before the new-connection phase: that one has
	// up to 256 streams in flight, more than one pooled connection
	// carries (100), and the extra connections would stay pooled, so
	// the bulk stream and the requests would no longer be known to
	// share the one connection this phase is about.
	slowFor := 2 * r.cfg.duration // about half of it with the stream idle
	if d.name == scDirect || d.name == scCrossNode {
		slowFor = max(slowFor, r.cfg.holTargetPhase)
	}
	slow, err := r.headOfLine(ctx, p, d, slowFor, slowSinkPort, r.servers[d.server].slow)
	if err != nil {
		return fmt.Errorf("head-of-line (a bulk stream with a slow reader): %w", err)
	}
	res.LatencyHOLSlow, res.LatencyHOLSlowIdle = slow.latency, slow.idle
	res.HOLSlowTurnP99, res.HOLSlowIdleTurnP99 = slow.turnP99, slow.idleTurnP99
	res.HOLSlowBulkGbps, res.HOLSlowHBONEConns = slow.bulkGbps, slow.hboneConn
	r.progress("[%s] 1 KiB requests beside a bulk stream with a slow reader (%.2f Gbit/s; %d HBONE connections): p50 %.0fµs p99 %.0fµs, a half-second turn's median p99 %.0fµs; in the turns between, the stream idle: p50 %.0fµs p99 %.0fµs, median p99 %.0fµs (%.2f×)",
		d.name, slow.bulkGbps, slow.hboneConn, slow.latency.P50, slow.latency.P99, slow.turnP99,
		slow.idle.P50, slow.idle.P99, slow.idleTurnP99, safeRatio(slow.turnP99, slow.idleTurnP99))
	full, err := r.headOfLine(ctx, p, d, r.cfg.duration, sinkPort, nil)
	if err != nil {
		return fmt.Errorf("head-of-line (a full-rate bulk stream): %w", err)
	}
	res.LatencyHOL, res.HOLBulkGbps, res.HOLHBONEConns = full.latency, full.bulkGbps, full.hboneConn
	r.progress("[%s] 1 KiB requests beside a full-rate bulk stream (%.2f Gbit/s; %d HBONE connections): p50 %.0fµs p99 %.0fµs (%.2f × the unloaded p99)",
		d.name, full.bulkGbps, full.hboneConn, full.latency.P50, full.latency.P99, safeRatio(full.latency.P99, res.Latency.P99))
	return nil
}

// fresh restarts every ztunnel, warms the path up, runs fn and then checks
// that the traffic went where the scenario says (each ztunnel on the path
// counted at least every connection the harness made, the others none),
// that nothing failed on the server side and that the ztunnels still run.
// counted accumulates each node's connection count.
func (r *runner) fresh(ctx context.Context, d scenarioDef, p *path, counted map[int]float64, fn func() error) error {
	if err := r.restartAll(ctx); err != nil {
		return err
	}
	srv := r.servers[d.server]
	srvFails, _ := srv.failures()
	dials0 := p.dials.Load()
	before := map[int]nodeMetrics{}
	for _, n := range r.mesh.Nodes {
		m, err := scrape(ctx, n)
		if err != nil {
			return err
		}
		before[n.Index] = m
	}
	// Warm-up: certificates fetched, HBONE pool connected, code paged in,
	// and start-up over: a restarted ztunnel is still finishing it (pod
	// listeners, certificates, the first handshake) for a few hundred ms
	// and gives those pages back at its next text trim (every 0.5 s in
	// its first minute, memory.go), so the RSS of the phases below is
	// that of the ztunnel under their load, not of its start-up.
	if _, err := p.openLoop(ctx, 1000, warmUp, true, 4); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if _, err := p.openLoop(ctx, 500, 40*time.Millisecond, false, 4); err != nil {
		return fmt.Errorf("warm-up (new connections): %w", err)
	}
	if err := fn(); err != nil {
		return err
	}
	made := float64(p.dials.Load() - dials0)
	for _, n := range r.mesh.Nodes {
		if done, werr := n.Exited(); done {
			return fmt.Errorf("ztunnel on node%d exited during the scenario: %v (log %s)", n.Index, werr, n.LogPath)
		}
		after, err := scrape(ctx, n)
		if err != nil {
			return err
		}
		delta := after.opened - before[n.Index].opened
		counted[n.Index] += delta
		onPath := slices.Contains(d.onPath, n.Index)
		switch {
		case onPath && !after.hasOpened:
			return fmt.Errorf("node%d ztunnel exports no istio_tcp_connections_opened_total on :15020/metrics: cannot prove the traffic went through it", n.Index)
		case onPath && delta < made:
			return fmt.Errorf("node%d ztunnel counted %v connections, the harness made %v: traffic bypassed it", n.Index, delta, made)
		case !onPath && delta != 0:
			return fmt.Errorf("node%d ztunnel counted %v connections but is not on this path", n.Index, delta)
		}
	}
	if fails, ferr := srv.failures(); fails != srvFails {
		return fmt.Errorf("%d server-side failures: %w", fails-srvFails, ferr)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func fmtCosts(cs []ZtunnelCost, f func(ZtunnelCost) float64, format string) string {
	s := ""
	for i, c := range cs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("node%d="+format, c.Node, f(c))
	}
	return s
}
