package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// -interleave N (with -peer) compares the two builds' connection rate in
// one sitting: N rounds, each a short connection loop on ours and one on
// the peer on hbone-cross-node, the first of each round alternating. Both
// clusters are up for the whole run, so a round's two slices are seconds
// apart instead of the half minute of alternating whole runs
// (scripts/bench-ab), and the VM's drifts — its load moves by 10–15 %
// between runs — fall on both alike. What it reports is paired: each
// round's peer/ours ratio, their median and how many rounds the peer
// won, for connections per second and for CPU per connection — and, from
// a 1000 rps slice on reused connections after each pair of connection
// loops, for the ztunnels' CPU at that rate (the CPU target's load) and
// the requests' p50 — and, from a one-stream bulk slice after those, for
// the throughput target's figure and the CPU it costs per GB — and, from
// a head-of-line slice last (the same rate beside a full-rate bulk stream
// on the same HBONE connection), for those requests' p50 and p99.

// interleaveSlice is each side's share of a round, per measurement.
const interleaveSlice = 2 * time.Second

// InterleaveResult is results.json's "interleave".
type InterleaveResult struct {
	Rounds       int     `json:"rounds"`
	SliceSeconds float64 `json:"slice_seconds"`
	// Per round, ours and the peer's figures (InterleaveSlice); CPU is
	// summed over the two nodes' ztunnels.
	Ours []InterleaveSlice `json:"ours"`
	Peer []InterleaveSlice `json:"peer"`
	// Summary of the paired rounds (see summarizePairs).
	ConnPerS     PairedSummary `json:"conn_per_s"`
	CPUPerConnUS PairedSummary `json:"cpu_per_conn_us"`
	VCPUAtRate   PairedSummary `json:"vcpu_at_rate"`
	P50AtRateUS  PairedSummary `json:"p50_at_rate_us"`
	P99AtRateUS  PairedSummary `json:"p99_at_rate_us"`
	Gbps1Stream  PairedSummary `json:"gbps_1_stream"`
	CPUSecPerGB  PairedSummary `json:"cpu_s_per_gb"`
	HOLP50US     PairedSummary `json:"hol_p50_us"`
	HOLP99US     PairedSummary `json:"hol_p99_us"`
	Rate         int           `json:"rate_rps"`
	ScenarioName string        `json:"scenario"`
}

// InterleaveSlice is one side's figures in one round.
type InterleaveSlice struct {
	ConnPerS     float64 `json:"conn_per_s"`
	CPUPerConnUS float64 `json:"cpu_per_conn_us"`
	VCPUAtRate   float64 `json:"vcpu_at_rate"`
	P50AtRateUS  float64 `json:"p50_at_rate_us"`
	P99AtRateUS  float64 `json:"p99_at_rate_us"`
	Gbps1Stream  float64 `json:"gbps_1_stream"`
	CPUSecPerGB  float64 `json:"cpu_s_per_gb"` // both nodes' ztunnels, on that stream
	// The fixed rate's latency beside a full-rate bulk stream.
	HOLP50US float64 `json:"hol_p50_us"`
	HOLP99US float64 `json:"hol_p99_us"`
}

// PairedSummary condenses per-round pairs (a = ours, b = the peer).
type PairedSummary struct {
	OursMedian  float64 `json:"ours_median"`
	PeerMedian  float64 `json:"peer_median"`
	RatioMedian float64 `json:"ratio_median"` // median over rounds of peer/ours
	PeerHigher  int     `json:"peer_higher"`  // rounds where the peer's figure was the higher
	Rounds      int     `json:"rounds"`
}

// summarizePairs pairs a[i] with b[i]; rounds with a zero in a are left out
// of the ratio.
func summarizePairs(a, b []float64) PairedSummary {
	s := PairedSummary{Rounds: len(a)}
	var ratios []float64
	for i := range a {
		if b[i] > a[i] {
			s.PeerHigher++
		}
		if a[i] > 0 {
			ratios = append(ratios, b[i]/a[i])
		}
	}
	s.RatioMedian = median(ratios)
	// median sorts: the pairs are done with by now, and the callers'
	// slices stay as they were.
	s.OursMedian, s.PeerMedian = median(slices.Clone(a)), median(slices.Clone(b))
	return s
}

// interleave runs the rounds on hbone-cross-node (see above).
func interleave(ctx context.Context, ours, peer *runner, rounds int, slice time.Duration, progress func(string, ...any)) (*InterleaveResult, error) {
	d, _ := findScenario(scCrossNode)
	rate := ours.cfg.rate
	// side returns one side's four measurements, each into s: the
	// connection loop, the fixed rate on reused connections, one bulk
	// stream, and the fixed rate beside one.
	side := func(r *runner) (conn, rps, bulk, hol func(s *InterleaveSlice) error) {
		p := &path{client: r.mesh.Pods[d.client].Pod, server: r.mesh.Pods[d.server].IP}
		nodes := d.costNodes(len(r.mesh.Nodes))
		pidOf := func(ni int) int { return r.node(ni).Pid() }
		conn = func(s *InterleaveSlice) error {
			costs := make([]ZtunnelCost, len(nodes))
			return r.perUnit(nodes, pidOf, costs, func() (float64, error) {
				before := p.dials.Load()
				var err error
				s.ConnPerS, err = p.connRate(ctx, connRateWorkers, slice)
				return float64(p.dials.Load() - before), err
			}, func(c *ZtunnelCost, pd procDelta, conns float64) {
				s.CPUPerConnUS += float64(pd.cpu.Microseconds()) / conns
			})
		}
		rps = func(s *InterleaveSlice) error {
			costs := make([]ZtunnelCost, len(nodes))
			lat, err := r.withCost(ctx, nodes, pidOf, costs, func() (openLoopResult, error) {
				return p.openLoop(ctx, rate, slice, true, latencyConns)
			})
			if err != nil {
				return err
			}
			s.P50AtRateUS, s.P99AtRateUS = lat.latency.P50, lat.latency.P99
			for _, c := range costs {
				s.VCPUAtRate += c.CPUVCPU
			}
			return nil
		}
		bulk = func(s *InterleaveSlice) error {
			costs := make([]ZtunnelCost, len(nodes))
			return r.perUnit(nodes, pidOf, costs, func() (float64, error) {
				var bytes int64
				var err error
				s.Gbps1Stream, bytes, err = p.bulk(ctx, 1, slice)
				return float64(bytes) / 1e9, err
			}, func(c *ZtunnelCost, pd procDelta, gb float64) {
				s.CPUSecPerGB += pd.cpu.Seconds() / gb
			})
		}
		hol = func(s *InterleaveSlice) error {
			res, err := r.headOfLine(ctx, p, d, slice, sinkPort, nil)
			s.HOLP50US, s.HOLP99US = res.latency.P50, res.latency.P99
			return err
		}
		return conn, rps, bulk, hol
	}
	connA, rpsA, bulkA, holA := side(ours)
	connB, rpsB, bulkB, holB := side(peer)
	// One untimed round of slices each first: pooled connections,
	// certificates and caches warm before anything counts.
	var warm InterleaveSlice
	for _, f := range []func(*InterleaveSlice) error{connA, rpsA, bulkA, holA, connB, rpsB, bulkB, holB} {
		if err := f(&warm); err != nil {
			return nil, fmt.Errorf("interleave: warm-up: %w", err)
		}
	}
	res := &InterleaveResult{Rounds: rounds, SliceSeconds: slice.Seconds(), ScenarioName: scCrossNode, Rate: rate}
	for i := range rounds {
		var sa, sb InterleaveSlice
		// Who goes first alternates by round, for every measurement.
		steps := []func() error{
			func() error { return connA(&sa) }, func() error { return connB(&sb) },
			func() error { return rpsA(&sa) }, func() error { return rpsB(&sb) },
			func() error { return bulkA(&sa) }, func() error { return bulkB(&sb) },
			func() error { return holA(&sa) }, func() error { return holB(&sb) },
		}
		if i%2 == 1 {
			for j := 0; j < len(steps); j += 2 {
				steps[j], steps[j+1] = steps[j+1], steps[j]
			}
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, fmt.Errorf("interleave: round %d: %w", i+1, err)
			}
		}
		res.Ours, res.Peer = append(res.Ours, sa), append(res.Peer, sb)
		progress("[interleave] round %d/%d: ours %.0f conn/s %.0f µs CPU/conn, %d rps %.4f vCPU p50 %.0fµs p99 %.0fµs, 1 stream %.2f Gbit/s %.2f CPU s/GB, beside it p50 %.0fµs p99 %.0fµs; peer %.0f conn/s %.0f µs CPU/conn, %.4f vCPU p50 %.0fµs p99 %.0fµs, %.2f Gbit/s %.2f CPU s/GB, beside it p50 %.0fµs p99 %.0fµs",
			i+1, rounds, sa.ConnPerS, sa.CPUPerConnUS, rate, sa.VCPUAtRate, sa.P50AtRateUS, sa.P99AtRateUS, sa.Gbps1Stream, sa.CPUSecPerGB, sa.HOLP50US, sa.HOLP99US,
			sb.ConnPerS, sb.CPUPerConnUS, sb.VCPUAtRate, sb.P50AtRateUS, sb.P99AtRateUS, sb.Gbps1Stream, sb.CPUSecPerGB, sb.HOLP50US, sb.HOLP99US)
	}
	pair := func(get func(InterleaveSlice) float64) PairedSummary {
		return summarizePairs(field(res.Ours, get), field(res.Peer, get))
	}
	res.ConnPerS = pair(func(s InterleaveSlice) float64 { return s.ConnPerS })
	res.CPUPerConnUS = pair(func(s InterleaveSlice) float64 { return s.CPUPerConnUS })
	res.VCPUAtRate = pair(func(s InterleaveSlice) float64 { return s.VCPUAtRate })
	res.P50AtRateUS = pair(func(s InterleaveSlice) float64 { return s.P50AtRateUS })
	res.P99AtRateUS = pair(func(s InterleaveSlice) float64 { return s.P99AtRateUS })
	res.Gbps1Stream = pair(func(s InterleaveSlice) float64 { return s.Gbps1Stream })
	res.CPUSecPerGB = pair(func(s InterleaveSlice) float64 { return s.CPUSecPerGB })
	res.HOLP50US = pair(func(s InterleaveSlice) float64 { return s.HOLP50US })
	res.HOLP99US = pair(func(s InterleaveSlice) float64 { return s.HOLP99US })
	return res, nil
}

func field(ss []InterleaveSlice, f func(InterleaveSlice) float64) []float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	return v
}

// interleaveLine is the summary the run prints.
func interleaveLine(r *InterleaveResult, peer string) string {
	f := func(what string, p PairedSummary, format string) string {
		return fmt.Sprintf("%s ours "+format+", %s "+format+" (%.3f ×, higher in %d of %d)", what, p.OursMedian, peer, p.PeerMedian, p.RatioMedian, p.PeerHigher, p.Rounds)
	}
	return fmt.Sprintf("interleaved %s, %d rounds of %g s slices (medians of rounds; ratio %s/ours): %s; %s; %s; %s; %s; %s; %s; %s; %s",
		r.ScenarioName, r.Rounds, r.SliceSeconds, peer,
		f("conn/s", r.ConnPerS, "%.0f"),
		f("CPU µs per connection (both nodes)", r.CPUPerConnUS, "%.0f"),
		f(fmt.Sprintf("vCPU at %d rps (both nodes)", r.Rate), r.VCPUAtRate, "%.4f"),
		f(fmt.Sprintf("p50 µs at %d rps", r.Rate), r.P50AtRateUS, "%.0f"),
		f(fmt.Sprintf("p99 µs at %d rps", r.Rate), r.P99AtRateUS, "%.0f"),
		f("1 stream Gbit/s", r.Gbps1Stream, "%.2f"),
		f("CPU s per GB on it (both nodes)", r.CPUSecPerGB, "%.2f"),
		f(fmt.Sprintf("p50 µs at %d rps beside a full-rate stream", r.Rate), r.HOLP50US, "%.0f"),
		f("its p99 µs", r.HOLP99US, "%.0f"))
}
