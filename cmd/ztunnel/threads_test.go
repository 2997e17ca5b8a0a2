package main

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSetWorkerThreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	log := slog.New(slog.DiscardHandler)
	if got, scaled := setWorkerThreads(nil, 3, log); got != 3 || !scaled || runtime.GOMAXPROCS(0) != 3 {
		t.Errorf("configured 3: got %d (scaled %v), GOMAXPROCS %d", got, scaled, runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(8)
	if got, _ := setWorkerThreads(nil, 0, log); got != defaultWorkerThreads {
		t.Errorf("default on 8 Ps: got %d, want %d", got, defaultWorkerThreads)
	}
	runtime.GOMAXPROCS(1)
	if got, _ := setWorkerThreads(nil, 0, log); got != 1 {
		t.Errorf("default under a 1-CPU runtime: got %d, want 1 (never above the runtime's choice)", got)
	}
	runtime.GOMAXPROCS(5)
	if got, scaled := setWorkerThreads([]string{"GOMAXPROCS=5"}, 3, log); got != 5 || scaled {
		t.Errorf("explicit GOMAXPROCS: got %d (scaled %v), want it kept (5) and not scaled", got, scaled)
	}
}

// TestProcPolicy walks the policy through the loads that shaped it.
func TestProcPolicy(t *testing.T) {
	type step struct {
		used   float64
		queued bool // so many goroutines waiting that one period is enough
		want   int
	}
	// runConns feeds steps with conns connections open; run with one.
	runConns := func(t *testing.T, p *procPolicy, conns int64, steps []step) {
		t.Helper()
		for i, s := range steps {
			waiting := 0.0
			if s.queued {
				waiting = 2 * procsWindow * procsWaiting
			}
			if got := p.next(s.used, waiting, conns); got != s.want {
				t.Fatalf("period %d (used %.2f, queued %v, %d connections): %d Ps, want %d (policy %+v)", i, s.used, s.queued, conns, got, s.want, *p)
			}
		}
	}
	run := func(t *testing.T, p *procPolicy, steps []step) { t.Helper(); runConns(t, p, 1, steps) }
	repeat := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	t.Run("idle start-up comes down after the calm periods", func(t *testing.T) {
		run(t, newProcPolicy(2), cat(repeat(procsCalm-1, step{0.01, false, 2}), []step{{0.01, false, 1}}, repeat(20, step{0, false, 1})))
	})
	t.Run("one busy stream without queueing keeps one P", func(t *testing.T) {
		p := newProcPolicy(2)
		p.cur = 1
		run(t, p, repeat(40, step{0.95, false, 1}))
		// With no connection open at all (start-up work) too.
		runConns(t, p, 0, repeat(10, step{0.95, false, 1}))
	})
	t.Run("busy with other connections open doubles at once and stays", func(t *testing.T) {
		p := newProcPolicy(2)
		p.cur = 1
		runConns(t, p, 17, cat(repeat(5, step{0.45, false, 1}), []step{{0.55, false, 2}}, repeat(procsPatienceMax, step{0.6, false, 2})))
		// Idle with them still open: down after the calm periods.
		runConns(t, p, 17, cat(repeat(procsCalm-1, step{0.1, false, 2}), []step{{0.1, false, 1}}))
	})
	t.Run("queueing doubles up to the ceiling and stays there", func(t *testing.T) {
		p := newProcPolicy(6)
		p.cur = 1
		run(t, p, []step{{0.5, true, 2}, {1.2, true, 4}, {2.5, true, 6}, {5.5, true, 6}})
	})
	t.Run("CPU use above what half fits keeps the ceiling", func(t *testing.T) {
		run(t, newProcPolicy(2), cat(repeat(10, step{1.5, true, 2}), repeat(10, step{0.95, false, 2})))
	})
	t.Run("queueing at the ceiling does not stop a try", func(t *testing.T) {
		run(t, newProcPolicy(2), cat(repeat(procsCalm-1, step{0.6, true, 2}), []step{{0.6, true, 1}}))
	})
	t.Run("a busy count that fits tries half, and waits twice as long each time it is undone", func(t *testing.T) {
		p := newProcPolicy(2)
		var steps []step
		for _, patience := range []int{10, 20, 40, 80, 160, 320, 640, 640} { // procsCalm doubling to the cap
			steps = cat(steps, repeat(patience-1, step{0.7, false, 2}), []step{{0.7, false, 1}, {0.7, true, 2}})
		}
		run(t, p, steps)
		if p.patience != procsPatienceMax {
			t.Errorf("patience %d after eight undone halvings, want the cap %d", p.patience, procsPatienceMax)
		}
		// Idle is not busy: it halves after procsCalm whatever the patience.
		run(t, p, cat(repeat(procsCalm-1, step{0.1, false, 2}), []step{{0.1, false, 1}}))
	})
	t.Run("a halving that holds resets the patience", func(t *testing.T) {
		p := newProcPolicy(2)
		run(t, p, cat(repeat(procsCalm-1, step{0.7, false, 2}), []step{{0.7, false, 1}, {0.7, true, 2}}))
		if p.patience != 2*procsCalm {
			t.Fatalf("patience %d after an undone halving, want %d", p.patience, 2*procsCalm)
		}
		run(t, p, cat(repeat(2*procsCalm-1, step{0.7, false, 2}), []step{{0.7, false, 1}}, repeat(procsSettle, step{0.7, false, 1})))
		if p.patience != procsCalm {
			t.Errorf("patience %d after a halving held %d periods, want %d", p.patience, procsSettle, procsCalm)
		}
		// Queueing long after the halving does not lengthen the next wait,
		// and idle is back to halving after procsCalm.
		run(t, p, cat([]step{{0.9, true, 2}}, repeat(procsCalm-1, step{0.7, false, 2}), []step{{0.7, false, 1}}))
		run(t, p, repeat(procsSettle, step{0.7, false, 1}))
		run(t, p, cat([]step{{0.9, true, 2}}, repeat(procsCalm-1, step{0.1, false, 2}), []step{{0.1, false, 1}}))
	})
	t.Run("a calm run broken by a busy period starts again", func(t *testing.T) {
		run(t, newProcPolicy(2), cat(repeat(procsCalm-1, step{0.7, false, 2}), []step{{1.2, false, 2}},
			repeat(procsCalm-1, step{0.7, false, 2}), []step{{0.7, false, 1}}))
	})
	t.Run("eight Ps halve to four when the use fits", func(t *testing.T) {
		run(t, newProcPolicy(8), cat(repeat(procsCalm-1, step{3, false, 8}), []step{{3, false, 4}}, repeat(10, step{3.7, false, 4})))
	})
	t.Run("waits add up over the window at one count", func(t *testing.T) {
		p := newProcPolicy(2)
		p.cur = 1
		limit := procsWindow * procsWaiting // the window's sum that queues
		for i, c := range []struct {
			waiting float64
			want    int
		}{
			{0.9 * limit, 1}, // a spike alone
			{0, 1},
			{0.05 * limit, 1},
			{0.05 * limit, 1},
			{0, 1},           // the window holds 0.9 + 0.1: not above
			{0.5 * limit, 1}, // the spike has left it: 0.6
			{0.6 * limit, 2}, // 0.05 + 0.05 + 0.5 + 0.6 = 1.2
			{0, 2},
		} {
			if got := p.next(0.7, c.waiting, 1); got != c.want {
				t.Fatalf("period %d (waiting %.2f): %d Ps, want %d", i, c.waiting, got, c.want)
			}
		}
		// A steady wait just under the average never queues.
		p.cur, p.waits = 1, [procsWindow]float64{}
		for i := range 100 {
			if got := p.next(0.7, 0.95*procsWaiting, 1); got != 1 {
				t.Fatalf("period %d of a steady %.2f waiting: %d Ps, want 1", i, 0.95*procsWaiting, got)
			}
		}
		// What waited at two Ps does not count at one.
		p = newProcPolicy(2)
		for range procsCalm - 1 {
			p.next(0.7, 2*procsWaiting, 1)
		}
		if got := p.next(0.7, 2*procsWaiting, 1); got != 1 {
			t.Fatalf("busy but fitting at the ceiling for the patience: %d Ps, want 1", got)
		}
		if got := p.next(0.7, 2*procsWaiting, 1); got != 1 {
			t.Errorf("one period at twice the average right after the halving: %d Ps, want 1 (the periods before were at two)", got)
		}
	})
	t.Run("a ceiling of one never moves", func(t *testing.T) {
		run(t, newProcPolicy(1), []step{{5, true, 1}, {0, false, 1}, {0.9, true, 1}})
	})
}

func TestBucketMid(t *testing.T) {
	for _, c := range []struct{ lo, hi, want float64 }{
		{1e-6, 3e-6, 2e-6},
		{math.Inf(-1), 0, 0},
		{math.Inf(-1), 4e-9, 2e-9},
		{0.5, math.Inf(1), 0.5},
	} {
		if got := bucketMid(c.lo, c.hi); got != c.want {
			t.Errorf("bucketMid(%g, %g) = %g, want %g", c.lo, c.hi, got, c.want)
		}
	}
}

// TestRunnableWaits reads the runtime's own histogram: goroutines queued
// behind one another on one P add up to a long wait, and the next read
// counts only what happened since.
func TestRunnableWaits(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w := newRunnableWaits()
	w.since()
	var wg sync.WaitGroup
	start := time.Now()
	for range 200 { // each spins 300 µs while the rest wait their turn
		wg.Go(func() {
			for start := time.Now(); time.Since(start) < 300*time.Microsecond; {
			}
		})
	}
	wg.Wait()
	// The k-th waits about k × 300 µs: 6 s in all over some 60 ms, a
	// hundred goroutines waiting on average; the runtime samples one in eight.
	took := time.Since(start)
	if got := w.since(); float64(got)/float64(took) < 10 {
		t.Errorf("200 goroutines queued on one P for %v: %v of waits estimated, want over 10 × that", took, got)
	}
	time.Sleep(20 * time.Millisecond)
	// Whatever else of the test binary runs may wait a little, but not
	// one goroutine all along.
	if got := w.since(); got > 20*time.Millisecond {
		t.Errorf("a quiet 20 ms after: %v of waits, want under 20 ms", got)
	}
}

// TestProcScalerFollowsQueueing drives the scaler with a CPU clock and
// runnable waits and open connections the test sets: idle, it comes down
// from the ceiling; busy with one connection and no queueing it stays on
// one P; queueing brings the second back at once, and undoes a try at one;
// busy with other connections open it keeps two, and gets them back at
// once; and it stops with its context.
func TestProcScalerFollowsQueueing(t *testing.T) {
	var cpu atomic.Int64    // nanoseconds of CPU time
	var waited atomic.Int64 // the waits each period reads
	var busy atomic.Bool    // the CPU clock runs at 0.8 × the wall clock
	var conns atomic.Int64  // proxied connections open
	conns.Store(1)
	changed := make(chan int, 16)
	s := &procScaler{ceiling: 2, every: 20 * time.Millisecond, log: slog.New(slog.DiscardHandler),
		cpu:    func() time.Duration { return time.Duration(cpu.Load()) },
		waited: func() time.Duration { return time.Duration(waited.Load()) },
		conns:  conns.Load,
		set:    func(n int) { changed <- n }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx) }()
	clock := make(chan struct{})
	go func() {
		last := time.Now()
		for {
			select {
			case <-clock:
				return
			case <-time.After(2 * time.Millisecond):
				now := time.Now()
				if busy.Load() {
					cpu.Add(int64(now.Sub(last)) * 4 / 5)
				}
				last = now
			}
		}
	}()
	defer close(clock)
	wait := func(want int) {
		t.Helper()
		select {
		case n := <-changed:
			if n != want {
				t.Fatalf("GOMAXPROCS set to %d, want %d", n, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no change to %d within 5 s", want)
		}
	}
	still := func(what string) {
		t.Helper()
		select {
		case n := <-changed:
			t.Fatalf("set to %d while %s", n, what)
		case <-time.After(10 * s.every):
		}
	}
	wait(1) // idle from the start: down from the ceiling after the calm periods
	busy.Store(true)
	still("busy on one P without queueing")
	waited.Store(int64(2 * s.every)) // two goroutines waiting all along
	wait(2)
	wait(1) // 0.8 cores fit in one: a try after the patience…
	wait(2) // …undone by the queueing at once
	waited.Store(int64(s.every / 10))
	conns.Store(5)
	still("busy with other connections open")
	busy.Store(false)
	wait(1)
	busy.Store(true) // a copy beside other connections: back at once
	wait(2)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}

// TestProcessCPU: the process's CPU clock moves with work done.
func TestProcessCPU(t *testing.T) {
	before := processCPU()
	x := 0
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
		x++
	}
	if got := processCPU() - before; got < 10*time.Millisecond {
		t.Errorf("50 ms of spinning (%d rounds) added %v of CPU time, want ≥ 10 ms", x, got)
	}
}
