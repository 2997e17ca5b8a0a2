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
// won, for connections per second and for CPU per connection.

// interleaveSlice is each side's share of a round.
const interleaveSlice = 2 * time.Second

// InterleaveResult is results.json's "interleave".
type InterleaveResult struct {
	Rounds       int     `json:"rounds"`
	SliceSeconds float64 `json:"slice_seconds"`
	// Per round, ours and the peer's: connections per second, and CPU
	// per connection summed over the two nodes' ztunnels.
	Ours []InterleaveSlice `json:"ours"`
	Peer []InterleaveSlice `json:"peer"`
	// Summary of the paired rounds (see summarizePairs).
	ConnPerS     PairedSummary `json:"conn_per_s"`
	CPUPerConnUS PairedSummary `json:"cpu_per_conn_us"`
	ScenarioName string        `json:"scenario"`
}

// InterleaveSlice is one side's figures in one round.
type InterleaveSlice struct {
	ConnPerS     float64 `json:"conn_per_s"`
	CPUPerConnUS float64 `json:"cpu_per_conn_us"`
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
	side := func(r *runner) func() (InterleaveSlice, error) {
		p := &path{client: r.mesh.Pods[d.client].Pod, server: r.mesh.Pods[d.server].IP}
		nodes := d.costNodes(len(r.mesh.Nodes))
		pidOf := func(ni int) int { return r.node(ni).Pid() }
		return func() (InterleaveSlice, error) {
			costs := make([]ZtunnelCost, len(nodes))
			var s InterleaveSlice
			err := r.perUnit(nodes, pidOf, costs, func() (float64, error) {
				before := p.dials.Load()
				var err error
				s.ConnPerS, err = p.connRate(ctx, connRateWorkers, slice)
				return float64(p.dials.Load() - before), err
			}, func(c *ZtunnelCost, pd procDelta, conns float64) {
				s.CPUPerConnUS += float64(pd.cpu.Microseconds()) / conns
			})
			return s, err
		}
	}
	a, b := side(ours), side(peer)
	// One untimed slice each first: pooled connections, certificates and
	// caches warm before anything counts.
	for _, f := range []func() (InterleaveSlice, error){a, b} {
		if _, err := f(); err != nil {
			return nil, fmt.Errorf("interleave: warm-up: %w", err)
		}
	}
	res := &InterleaveResult{Rounds: rounds, SliceSeconds: slice.Seconds(), ScenarioName: scCrossNode}
	for i := range rounds {
		var sa, sb InterleaveSlice
		var err error
		if i%2 == 0 {
			if sa, err = a(); err == nil {
				sb, err = b()
			}
		} else {
			if sb, err = b(); err == nil {
				sa, err = a()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("interleave: round %d: %w", i+1, err)
		}
		res.Ours, res.Peer = append(res.Ours, sa), append(res.Peer, sb)
		progress("[interleave] round %d/%d: ours %.0f conn/s %.0f µs CPU/conn, peer %.0f conn/s %.0f µs CPU/conn",
			i+1, rounds, sa.ConnPerS, sa.CPUPerConnUS, sb.ConnPerS, sb.CPUPerConnUS)
	}
	res.ConnPerS = summarizePairs(field(res.Ours, func(s InterleaveSlice) float64 { return s.ConnPerS }), field(res.Peer, func(s InterleaveSlice) float64 { return s.ConnPerS }))
	res.CPUPerConnUS = summarizePairs(field(res.Ours, func(s InterleaveSlice) float64 { return s.CPUPerConnUS }), field(res.Peer, func(s InterleaveSlice) float64 { return s.CPUPerConnUS }))
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
	return fmt.Sprintf("interleaved %s, %d rounds of %g s each: conn/s ours %.0f, %s %.0f (median of rounds; %s/ours %.3f ×, higher in %d of %d); CPU µs per connection (both nodes) ours %.0f, %s %.0f (%.3f ×, higher in %d of %d)",
		r.ScenarioName, r.Rounds, r.SliceSeconds,
		r.ConnPerS.OursMedian, peer, r.ConnPerS.PeerMedian, peer, r.ConnPerS.RatioMedian, r.ConnPerS.PeerHigher, r.ConnPerS.Rounds,
		r.CPUPerConnUS.OursMedian, peer, r.CPUPerConnUS.PeerMedian, r.CPUPerConnUS.RatioMedian, r.CPUPerConnUS.PeerHigher, r.CPUPerConnUS.Rounds)
}
