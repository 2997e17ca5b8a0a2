package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// Self-check of the latency figures (issue #14, point 2): right before
// each open-loop phase the harness times the same operation in the
// simplest possible way — one thread in the client pod doing it again and
// again, nothing scheduled, nothing queued — and records that as the
// phase's "loop" figure. For direct, where no proxy is involved, the
// open-loop p50 cannot honestly be far above the loop's p50: if it is, the
// harness (a backlog of its own, slow dials, a starved scheduler) is what
// was measured, and since every other scenario is reported as a ratio to
// direct, the run says so.
const (
	// loopOps: operations of each baseline loop; enough for a stable
	// median, few enough to cost ≈ 0.1 s.
	loopOps = 200
	// loopBudget bounds a loop on a slow path (through a congested
	// ztunnel): it stops after this long with what it has.
	loopBudget = 500 * time.Millisecond
	// plausibleNewConn: direct's new-connection open-loop p50 may be at
	// most this many times the plain loop's p50. Connect + round trip +
	// close is ≈ 200 µs on the development VM; the open loop pays a
	// wake-up or two more per request (the schedule thread, then the
	// worker), while a backlog or a serialized dial costs milliseconds.
	plausibleNewConn = 2.0
	// plausibleReused: the same for the reused-connection phase. Its plain
	// loop is a ≈ 35 µs round trip between two hot threads; at 1000
	// requests/s every thread on the path starts cold, and each of the
	// three or four wake-ups costs tens of µs in a VM, so 3-5 × is normal
	// there: only a gross excess (a backlog) is flagged.
	plausibleReused = 10.0
)

// baselineLoop runs op back to back on one thread inside the client pod
// for up to loopOps operations or loopBudget, and summarizes each one's
// duration. reuse: op is a 1 KiB round trip on one connection; otherwise
// dial, 1 KiB round trip, close.
func (p *path) baselineLoop(ctx context.Context, reuse bool) (Latency, error) {
	ds := make([]time.Duration, 0, loopOps)
	err := p.client.Do(func() error {
		req, resp := make([]byte, msgSize), make([]byte, msgSize)
		var c net.Conn
		if reuse {
			var err error
			if c, err = p.dialHere(ctx, echoPort); err != nil {
				return err
			}
			defer c.Close()
		}
		end := time.Now().Add(loopBudget)
		for i := 0; i < loopOps && time.Now().Before(end); i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			request(req, uint64(i))
			t0 := time.Now()
			conn := c
			if !reuse {
				var err error
				if conn, err = p.dialHere(ctx, echoPort); err != nil {
					return err
				}
			}
			err := roundTrip(conn, req, resp)
			if !reuse {
				conn.Close()
			}
			if err != nil {
				return fmt.Errorf("baseline loop, operation %d: %w", i, err)
			}
			ds = append(ds, time.Since(t0))
			p.verified.Add(msgSize)
		}
		return nil
	})
	if err != nil {
		return Latency{}, err
	}
	return summarize(ds), nil
}

// implausible says why an open-loop phase's p50 cannot be trusted against
// its plain loop's (allowed: factor × the loop's p50), or "" when it is
// plausible (or either is missing).
func implausible(phase string, open, loop Latency, factor float64) string {
	if loop.Count == 0 || open.Count == 0 || open.P50 <= factor*loop.P50 {
		return ""
	}
	return fmt.Sprintf("%s: open-loop p50 %.0f µs is %.1f × a plain loop's p50 %.0f µs (> %.0f ×): the harness, not the path, was measured",
		phase, open.P50, open.P50/loop.P50, loop.P50, factor)
}

// flagImplausible copies direct's implausible figures onto every other
// scenario (their ratios rest on them), under the same field name, so a
// reader of one scenario in results.json sees it too.
func flagImplausible(rs []ScenarioResult) {
	d, ok := byName(rs, scDirect)
	if !ok {
		return
	}
	for i := range rs {
		if rs[i].Name == scDirect {
			continue
		}
		for _, why := range d.Implausible {
			field, _, _ := strings.Cut(why, ":")
			rs[i].Implausible = append(rs[i].Implausible, field+": its ratio to direct rests on direct's implausible figure")
		}
	}
}

// implausibleMark is "!" when the scenario's figure named field is
// flagged, for the table.
func implausibleMark(r ScenarioResult, field string) string {
	for _, why := range r.Implausible {
		if strings.HasPrefix(why, field+":") {
			return "!"
		}
	}
	return ""
}
