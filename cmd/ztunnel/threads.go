package main

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// defaultWorkerThreads is upstream's ZTUNNEL_WORKER_THREADS default. A node
// proxy needs few threads; more Ps than that mostly add wake-ups (each a
// context switch, tens of µs on a VM) as idle threads are started to look
// for work, which is what an idle-most-of-the-time proxy does all day.
const defaultWorkerThreads = 2

// setWorkerThreads sets GOMAXPROCS from ZTUNNEL_WORKER_THREADS (upstream's
// knob; configured is 0 when unset) unless GOMAXPROCS itself is set. The
// default never exceeds the runtime's own choice, which already follows
// the container's CPU limit. It returns the value in force, and whether
// it is ztunnel's to scale (procScaler): not when GOMAXPROCS was given.
func setWorkerThreads(environ []string, configured int, log *slog.Logger) (int, bool) {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return runtime.GOMAXPROCS(0), false
		}
	}
	n := configured
	if n == 0 {
		n = min(defaultWorkerThreads, runtime.GOMAXPROCS(0))
	}
	if prev := runtime.GOMAXPROCS(n); prev != n {
		log.Info("worker threads", "gomaxprocs", n, "was", prev)
	}
	return n, true
}

// Worker threads are a ceiling, not a constant. procScaler runs the proxy
// on as few Ps as keep goroutines from waiting for one. With a P idle, the
// runtime wakes a thread to spin looking for work whenever a goroutine
// becomes runnable (a socket became readable), and at a light load it
// finds none; on one P the data path stays on one thread (perf record -a
// of the 1000 rps phase: each ztunnel's samples fell on a single thread).
// Measured on the 2-vCPU VM against the fixed two Ps: CPU per ztunnel at
// 1000 rps 0.044 against 0.049 vCPU (medians of eight pairs), added p99
// +73 to +147 µs against +140 to +763.
//
// Two things say the work needs more Ps. Goroutines waiting for one: the
// runtime samples how long goroutines sat runnable (/sched/latencies,
// one transition in eight), and their sum over a time is how many waited
// on average. On one P, per 250 ms, that read 0.00–0.13 at 1000 rps, but
// 1.4–7.1 in the connection loop (0.9 × the connections per second on one
// P). Above half a goroutine waiting over a sliding half second of 100 ms
// periods, another P comes; the more wait, the sooner (the connection loop
// within one period).
//
// And a busy P with other connections open: a goroutine that a socket
// made ready waits for the runtime to poll the network, which a busy P
// does only when it runs out of work or sysmon's 10 ms poll comes round.
// Requests beside a full-rate copy waited 8.2–10.3 ms at the p50 on a
// fixed single P against 3.4–7.5 ms with the second P (2026-12-08), though
// few goroutines ever sat runnable (the waits read 0.1–2.3), so over half
// a core used with more than one connection open brings the second P as
// before. A lone connection is
// the exception that pays: one bulk stream keeps one P 50–75 % busy, yet
// its goroutines hand the data on to one another and a second P only
// moves each hand-off to another thread (bench -interleave, this policy
// against CPU use alone, four runs of 20 rounds, two each way round: one
// stream 1.035–1.115 ×, faster in 62 of 80 rounds, at 0.905–0.988 × the
// CPU per GB; connections per second 1.02–1.05 × (56 of 80); requests
// beside a full-rate stream lower at the p50 in 28 of 40 rounds; the 1000
// rps figures unchanged).
//
// An idle process gives Ps back after a second; a lone connection's load
// that fits in fewer does too, and when goroutines then queue at once the
// next try waits twice as long (up to a minute), so such a load spends a
// period or two a minute on too few. The count in use is
// go_sched_gomaxprocs_threads on :15020/metrics.
const (
	procsEvery = 100 * time.Millisecond // how often CPU use and waits are read
	// procsWaiting is the average number of goroutines waiting for a P
	// over the last procsWindow periods at the same count above which the
	// work needs more Ps.
	procsWaiting = 0.5
	procsWindow  = 5
	// procsBusy × cur cores used with other connections open needs more.
	procsBusy = 0.5
	// Ps halve after some periods in a row whose CPU use fits in half of
	// them: procsCalm periods when the process is idle (below procsIdle ×
	// half cores), so that after start-up (busy, at the ceiling) it is
	// down to what it needs about a second after the load is gone; with a
	// lone connection open, patience periods below procsFits × half, which
	// starts at procsCalm too, doubles up to procsPatienceMax (64 s) each
	// time a halving is undone within procsSettle periods, and falls back
	// once one holds. Changing GOMAXPROCS stops the world for microseconds:
	// a try costs the queueing until it is undone, not the switch.
	procsCalm        = 10
	procsIdle        = 0.25
	procsFits        = 0.9
	procsPatienceMax = 640
	procsSettle      = 20
)

// procPolicy decides each period's P count from the CPU the process used,
// how many goroutines waited for a P and how many connections are open.
// It is pure; procScaler feeds it.
type procPolicy struct {
	ceiling   int
	cur       int                  // Ps in use
	waits     [procsWindow]float64 // goroutines waiting in the last periods at cur
	calm      int                  // periods in a row that fit in half the Ps
	patience  int                  // calm periods that halve a busy lone connection
	sinceDown int                  // periods since the last halving; -1 once settled
	period    int                  // periods so far, to place waits
}

func newProcPolicy(ceiling int) *procPolicy {
	return &procPolicy{ceiling: ceiling, cur: ceiling, patience: procsCalm, sinceDown: -1}
}

// next returns the Ps for the next period, given the cores used and the
// goroutines waiting for a P on average over the last one, and the
// proxied connections open.
func (p *procPolicy) next(used, waiting float64, conns int64) int {
	p.waits[p.period%procsWindow] = waiting
	p.period++
	var sum float64
	for _, w := range p.waits {
		sum += w
	}
	queued := sum > procsWaiting*procsWindow
	lone := conns <= 1
	if p.sinceDown >= 0 {
		if p.sinceDown++; p.sinceDown >= procsSettle {
			p.patience, p.sinceDown = procsCalm, -1 // the last halving held
		}
	}
	half := max(1, p.cur/2)
	switch {
	case p.cur < p.ceiling && (queued || (!lone && used > procsBusy*float64(p.cur))):
		if p.sinceDown >= 0 { // undone soon after: wait longer next time
			p.patience = min(2*p.patience, procsPatienceMax)
		}
		p.set(min(p.ceiling, 2*p.cur))
		p.sinceDown = -1
	case p.cur > 1 && (used < procsIdle*float64(half) || (lone && used < procsFits*float64(half))):
		// Queueing at the ceiling does not stop a try: on a crowded node
		// it is the OS keeping threads off the CPUs as much as the Ps.
		p.calm++
		need := p.patience
		if used < procsIdle*float64(half) {
			need = procsCalm
		}
		if p.calm >= need {
			p.set(half)
			p.sinceDown = 0
		}
	default:
		p.calm = 0
	}
	return p.cur
}

// set moves to n Ps; waits seen at the old count say little about the new.
func (p *procPolicy) set(n int) {
	p.cur, p.calm, p.waits = n, 0, [procsWindow]float64{}
}

// procScaler keeps GOMAXPROCS between 1 and ceiling by procPolicy.
type procScaler struct {
	ceiling int
	every   time.Duration
	cpu     func() time.Duration // the process's CPU time so far
	waited  func() time.Duration // time goroutines sat runnable since the last call
	conns   func() int64         // proxied connections open now
	set     func(int)            // sets GOMAXPROCS
	log     *slog.Logger
}

func newProcScaler(ceiling int, conns func() int64, log *slog.Logger) *procScaler {
	return &procScaler{ceiling: ceiling, every: procsEvery, cpu: processCPU, waited: newRunnableWaits().since,
		conns: conns, set: func(n int) { runtime.GOMAXPROCS(n) }, log: log}
}

// run scales until ctx ends, starting from the ceiling (start-up is the
// busy part).
func (s *procScaler) run(ctx context.Context) {
	if s.ceiling <= 1 {
		return
	}
	t := time.NewTicker(s.every)
	defer t.Stop()
	pol := newProcPolicy(s.ceiling)
	last, lastAt := s.cpu(), time.Now()
	s.waited() // start the waits' period here
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c := s.cpu()
			period := float64(now.Sub(lastAt))
			used := float64(c-last) / period
			waiting := float64(s.waited()) / period
			last, lastAt = c, now
			cur := pol.cur
			conns := s.conns()
			if next := pol.next(used, waiting, conns); next != cur {
				s.set(next)
				s.log.Debug("worker threads in use", "gomaxprocs", next, "was", cur, "cpu_cores", used,
					"waiting_goroutines", waiting, "connections", conns)
			}
		}
	}
}

// runnableWaits reads the runtime's sampled histogram of how long
// goroutines sat runnable before they ran.
type runnableWaits struct {
	sample []metrics.Sample
	prev   []uint64
}

func newRunnableWaits() *runnableWaits {
	return &runnableWaits{sample: []metrics.Sample{{Name: "/sched/latencies:seconds"}}}
}

// since returns the time goroutines spent runnable since the last call,
// estimated from the runtime's samples.
func (w *runnableWaits) since() time.Duration {
	metrics.Read(w.sample)
	if w.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0 // not in this runtime: never queued
	}
	h := w.sample[0].Value.Float64Histogram()
	if len(w.prev) != len(h.Counts) {
		w.prev = make([]uint64, len(h.Counts))
	}
	var sum float64
	for i, c := range h.Counts {
		sum += float64(c-w.prev[i]) * bucketMid(h.Buckets[i], h.Buckets[i+1])
		w.prev[i] = c
	}
	return time.Duration(math.Round(sum * runtimeWaitSampling * 1e9))
}

// runtimeWaitSampling: the runtime records one goroutine transition in
// eight in /sched/latencies (gTrackingPeriod).
const runtimeWaitSampling = 8

// bucketMid is a histogram bucket's representative value in seconds: its
// middle, or its finite edge when the other is infinite.
func bucketMid(lo, hi float64) float64 {
	switch {
	case math.IsInf(lo, -1) || lo < 0:
		return max(0, hi) / 2
	case math.IsInf(hi, 1):
		return lo
	default:
		return (lo + hi) / 2
	}
}

// processCPU is the user and system time of all the process's threads.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
