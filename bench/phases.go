package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// procSnap is a process's CPU time and context switches at one moment;
// the phases' costs are differences of two.
type procSnap struct {
	cpu     time.Duration // in ticks, exited threads included
	threads time.Duration // exact, live threads (see cpuSpent)
	exact   bool          // threads was read
	sw      Switches
}

func readProcSnap(pid int) (procSnap, error) {
	threads, exact := threadsCPU(pid)
	cpu, err := processCPU(pid)
	if err != nil {
		return procSnap{}, err
	}
	sw, err := processSwitches(pid)
	return procSnap{cpu: cpu, threads: threads, exact: exact, sw: sw}, err
}

// procDelta is what a process spent between two snapshots.
type procDelta struct {
	cpu      time.Duration
	vol, all float64 // voluntary, and all, context switches
	syscalls float64
}

func (s procSnap) since(b procSnap) procDelta {
	vol := float64(s.sw.Voluntary - b.sw.Voluntary)
	return procDelta{
		cpu:      cpuSpent(b.cpu, s.cpu, b.threads, s.threads, b.exact && s.exact),
		vol:      vol,
		all:      vol + float64(s.sw.Nonvoluntary-b.sw.Nonvoluntary),
		syscalls: float64(s.sw.Syscalls - b.sw.Syscalls),
	}
}

// withCost runs fn while measuring each node's CPU time and RSS. The peak
// is the kernel's high-water mark over the phase (resetPeakRSS), so the
// sampler that gives the median and the anonymous peak can run seldom:
// at 10 Hz its wake-ups showed in the latency it was measuring (requests
// due in the 10 ms before each tick were 14–21 % of the slowest 10 %,
// direct and through ztunnel alike).
// pidOf gives the process measured for each node.
func (r *runner) withCost(ctx context.Context, nodes []int, pidOf func(int) int, costs []ZtunnelCost, fn func() (openLoopResult, error)) (openLoopResult, error) {
	pids := make([]int, len(nodes))
	before := make([]procSnap, len(nodes))
	hwm := make([]bool, len(nodes))
	for i, ni := range nodes {
		pids[i] = pidOf(ni)
		costs[i].OpenFilesLimit, _ = openFilesLimit(pids[i])
		var err error
		if before[i], err = readProcSnap(pids[i]); err != nil {
			return openLoopResult{}, err
		}
		hwm[i] = resetPeakRSS(pids[i]) == nil // else the samples' peak
	}
	peak, anonPeak := make([]int64, len(nodes)), make([]int64, len(nodes))
	all := make([][]float64, len(nodes))
	sample := func() {
		for i, pid := range pids {
			f, err := readRSS(pid)
			if err != nil {
				continue
			}
			peak[i], anonPeak[i] = max(peak[i], f.rss), max(anonPeak[i], f.anon)
			if hwm[i] {
				peak[i] = max(peak[i], f.hwm)
			}
			all[i] = append(all[i], float64(f.rss))
		}
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(rssSampleEvery)
		defer t.Stop()
		for {
			sample()
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	t0 := time.Now()
	res, err := fn()
	wall := time.Since(t0)
	close(stop)
	<-sampled
	sample()
	if err != nil {
		return res, err
	}
	for i, pid := range pids {
		after, err := readProcSnap(pid)
		if err != nil {
			return res, err
		}
		d := after.since(before[i])
		costs[i].CPUVCPU = d.cpu.Seconds() / wall.Seconds()
		costs[i].RSSMB = float64(peak[i]) / (1 << 20)
		costs[i].RSSAnonMB = float64(anonPeak[i]) / (1 << 20)
		costs[i].RSSMedianMB = median(all[i]) / (1 << 20)
		if reqs := float64(res.latency.Count); reqs > 0 {
			costs[i].VolCtxSwitchesPerReq = d.vol / reqs
			costs[i].CtxSwitchesPerReq = d.all / reqs
			costs[i].SyscallsPerReq = d.syscalls / reqs
		}
	}
	return res, nil
}

// perUnit runs fn, which returns how many units of work it did
// (connections, GB), and gives each node's CPU time and context switches
// over it to set, with the units.
func (r *runner) perUnit(nodes []int, pidOf func(int) int, costs []ZtunnelCost, fn func() (float64, error), set func(c *ZtunnelCost, d procDelta, units float64)) error {
	before := make([]procSnap, len(nodes))
	for i, ni := range nodes {
		var err error
		if before[i], err = readProcSnap(pidOf(ni)); err != nil {
			return err
		}
	}
	n, err := fn()
	if err != nil || n <= 0 {
		return err
	}
	for i, ni := range nodes {
		after, err := readProcSnap(pidOf(ni))
		if err != nil {
			return err
		}
		set(&costs[i], after.since(before[i]), n)
	}
	return nil
}

// idle measures memory per idle proxied connection.
// It returns how many connections it held.
func (r *runner) idle(ctx context.Context, d string, p *path, nodes []int, costs []ZtunnelCost) (int, error) {
	type mem struct {
		rss       int64
		heapStack float64
		goMem     bool
		fds       int
	}
	measure := func() ([]mem, error) {
		for _, ni := range nodes {
			if err := gc(ctx, r.node(ni)); err != nil && !r.peer {
				return nil, err
			} // a -peer may have no Go heap endpoint: its RSS is then read without a GC first
		}
		if err := sleepCtx(ctx, idleSettle); err != nil {
			return nil, err
		}
		ms := make([]mem, len(nodes))
		for i, ni := range nodes {
			n := r.node(ni)
			st, err := readRSS(n.Pid())
			if err != nil {
				return nil, err
			}
			m, err := scrape(ctx, n)
			if err != nil {
				return nil, err
			}
			fds, err := openFDs(n.Pid())
			if err != nil {
				return nil, err
			}
			ms[i] = mem{st.rss, m.heapInuse + m.stack, m.goMem, fds}
		}
		return ms, nil
	}
	m0, err := measure()
	if err != nil {
		return 0, err
	}
	// A probe first: how many descriptors each ztunnel spends per idle
	// connection, so the phase stays within their RLIMIT_NOFILE.
	n := r.cfg.idleConns
	probe := min(n, idleProbe)
	conns, err := p.openIdle(ctx, probe, idleDialers)
	if err != nil {
		return 0, err
	}
	fit, worst := n, 0.0
	for i, ni := range nodes {
		pid := r.node(ni).Pid()
		fds, err1 := openFDs(pid)
		lim, err2 := openFilesLimit(pid)
		limit, err3 := strconv.Atoi(lim)
		if err := errors.Join(err1, err2, err3); err != nil {
			closeAll(conns)
			return 0, err
		}
		if per := float64(fds-m0[i].fds) / float64(probe); per > 0 {
			fit = min(fit, probe+int(float64(limit-fds-fdReserve/2)/per))
			worst = max(worst, per)
		}
	}
	if fit < n {
		note := fmt.Sprintf("%s: a ztunnel holds %.1f descriptors per idle connection; idle phase capped at %d connections (of %d) to stay within its RLIMIT_NOFILE", d, worst, fit, n)
		r.progress("WARNING: %s", note)
		r.notes = append(r.notes, note)
		n = fit
	}
	more, err := p.openIdle(ctx, n-probe, idleDialers)
	if err != nil {
		closeAll(conns)
		return 0, err
	}
	conns = append(conns, more...)
	m1, err := measure()
	if err != nil {
		closeAll(conns)
		return 0, err
	}
	if err := p.checkIdle(conns, idleDialers); err != nil {
		return 0, err
	}
	nc := float64(len(conns))
	for i := range nodes {
		costs[i].IdleRSSBeforeMB = float64(m0[i].rss) / (1 << 20)
		costs[i].IdleRSSMB = float64(m1[i].rss) / (1 << 20)
		costs[i].BytesPerIdleConn = float64(m1[i].rss-m0[i].rss) / nc
		if m0[i].goMem && m1[i].goMem {
			costs[i].HeapStackPerIdleCon = (m1[i].heapStack - m0[i].heapStack) / nc
		}
		costs[i].FDsPerIdleConn = float64(m1[i].fds-m0[i].fds) / nc
	}
	return len(conns), nil
}

// holResult is one head-of-line phase: the requests' latency, what the
// bulk stream moved and how many HBONE connections the client pod had
// open while both ran; with a valve, also the requests' latency while the
// bulk stream was idle.
type holResult struct {
	latency Latency
	idle    Latency
	// With a valve: turnSplit's loadedTurnP99 and idleTurnP99.
	turnP99, idleTurnP99 float64
	bulkGbps             float64
	hboneConn            int
}

// headOfLine runs the 1000 rps reused-connection latency phase while one
// bulk stream flows to port (sinkPort: as fast as the path goes;
// slowSinkPort: held back by a slow reader) between the same two pods,
// so, meshed, both share the pool key and, below the per-connection
// stream limit, one HBONE connection.
//
// With a valve (the slow sink's) the bulk writer runs and pauses in
// turns (alternate): requests due while it writes make latency, those due
// once it paused and the stream drained make idle, the rest count in
// neither. Both sets come from the same seconds of the same machine, so
// their ratio is not the difference between two moments of a VM whose
// p99 alone moves 2–5× from one phase to the next.
func (r *runner) headOfLine(ctx context.Context, p *path, d scenarioDef, dur time.Duration, port int, v *valve) (holResult, error) {
	var res holResult
	bulkConn, err := p.dial(ctx, port)
	if err != nil {
		return res, err
	}
	defer bulkConn.Close()
	var stopBulk sync.Once
	stopCh := make(chan struct{})
	done := func() bool {
		select {
		case <-stopCh:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	type bulkResult struct {
		n   int64
		err error
	}
	if v != nil {
		v.set(true)
		v.written.Store(0)
		v.read.Store(0)
	}
	bulkDone := make(chan bulkResult, 1)
	t0 := time.Now()
	go func() {
		n, err := p.stream(bulkConn, done, time.Now().Add(holRampUp+dur+bulkDrain+ioTimeout), v)
		bulkDone <- bulkResult{n, err}
	}()
	defer stopBulk.Do(func() { close(stopCh) })
	if err := sleepCtx(ctx, holRampUp); err != nil {
		return res, err
	}
	if d.name != scDirect && d.name != scPassthrough {
		if res.hboneConn, err = countEstablished(p.client.NS, 15008); err != nil {
			return res, err
		}
	}
	var turns []turn
	turnsDone := make(chan struct{})
	if v != nil {
		go func() {
			defer close(turnsDone)
			turns = alternate(v, stopCh, holTurn)
		}()
	} else {
		close(turnsDone)
	}
	lat, err := p.openLoop(ctx, r.cfg.rate, dur, true, latencyConns)
	stopBulk.Do(func() { close(stopCh) })
	<-turnsDone // the valve is open again: the writer sees stopCh
	b := <-bulkDone
	if err != nil {
		return res, err
	}
	if b.err != nil {
		return res, fmt.Errorf("bulk stream: %w", b.err)
	}
	res.latency = lat.latency
	if v != nil {
		ts := splitByTurn(lat, turns, holSettle)
		res.latency, res.idle = ts.loaded, ts.idle
		res.turnP99, res.idleTurnP99 = ts.loadedTurnP99, ts.idleTurnP99
	}
	res.bulkGbps = gbps(b.n, time.Since(t0))
	return res, nil
}

// bulkState is what the bulk stream of a head-of-line phase does.
type bulkState int

const (
	bulkMoving   bulkState = iota // the writer writes, the reader reads
	bulkDraining                  // the writer paused; bytes still in flight
	bulkIdle                      // the writer paused and everything was read
)

// turn is a moment the bulk stream entered a state.
type turn struct {
	at    time.Time
	state bulkState
}

// alternate runs the valve's writer for each turn, then closes it, waits
// for the stream to drain and leaves it idle for another turn, until stop;
// it leaves the valve open and returns when each state began.
func alternate(v *valve, stop <-chan struct{}, each time.Duration) []turn {
	defer v.set(true)
	var turns []turn
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-stop:
			return false
		case <-t.C:
			return true
		}
	}
	for {
		if !wait(each) {
			return turns
		}
		v.set(false)
		turns = append(turns, turn{time.Now(), bulkDraining})
		for !v.drained() {
			if !wait(time.Millisecond) {
				return turns
			}
		}
		turns = append(turns, turn{time.Now(), bulkIdle})
		if !wait(each) {
			return turns
		}
		v.set(true)
		turns = append(turns, turn{time.Now(), bulkMoving})
	}
}

// turnSplit is an alternating phase's requests sorted by what the bulk
// stream did when each was due.
type turnSplit struct {
	loaded, idle Latency // all requests due while it moved / was idle
	// The median over turns of each turn's p99: a VM stall of tens of ms
	// delays every request due in it and can alone set a whole set's p99,
	// but only one turn's; queueing the path causes raises them all.
	loadedTurnP99, idleTurnP99 float64
}

// minTurnRequests: a turn with fewer requests (the phase's last, cut
// short) has no p99 worth the name and is left out of the medians.
const minTurnRequests = 100

// splitByTurn sorts the requests of lat by the bulk stream's state when
// each was due (moving before the first turn), leaving out those due while
// it drained and those due less than settle after it began moving.
func splitByTurn(lat openLoopResult, turns []turn, settle time.Duration) turnSplit {
	var on, off []time.Duration
	perTurn := make([][]time.Duration, len(turns)+1)
	k := 0 // turns[:k] are at or before the current request's due time
	for i, l := range lat.each {
		due := lat.start.Add(lat.slots.due(i))
		for k < len(turns) && !turns[k].at.After(due) {
			k++
		}
		state, since := bulkMoving, time.Duration(-1)
		if k > 0 {
			state, since = turns[k-1].state, due.Sub(turns[k-1].at)
		}
		switch {
		case state == bulkDraining, state == bulkMoving && since >= 0 && since < settle:
			continue
		case state == bulkMoving:
			on = append(on, l)
		default:
			off = append(off, l)
		}
		perTurn[k] = append(perTurn[k], l)
	}
	var onP99, offP99 []float64
	for k, ls := range perTurn {
		if len(ls) < minTurnRequests {
			continue
		}
		if k == 0 || turns[k-1].state == bulkMoving {
			onP99 = append(onP99, summarize(ls).P99)
		} else {
			offP99 = append(offP99, summarize(ls).P99)
		}
	}
	return turnSplit{loaded: summarize(on), idle: summarize(off), loadedTurnP99: median(onP99), idleTurnP99: median(offP99)}
}
