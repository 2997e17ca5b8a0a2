package main

import (
	"context"
	"log/slog"
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

func TestNextProcs(t *testing.T) {
	for _, c := range []struct {
		name               string
		cur, ceiling       int
		used               float64
		calm, want, wantCl int
	}{
		{"busy single P doubles", 1, 2, 0.6, 0, 2, 0},
		{"busy at the ceiling stays", 2, 2, 1.9, 0, 2, 0},
		{"busy doubles up to the ceiling only", 4, 6, 2.5, 0, 6, 0},
		{"moderate load on one P stays", 1, 2, 0.4, 0, 1, 0},
		{"between the thresholds keeps two and resets calm", 2, 2, 0.3, 2, 2, 0},
		{"calm counts", 2, 2, 0.1, 1, 2, 2},
		{"calm long enough halves", 2, 2, 0.1, 3, 1, 0},
		{"eight calm Ps go to four", 8, 8, 0.5, 3, 4, 0},
		{"eight Ps busier than a quarter of four stay", 8, 8, 1.2, 3, 8, 0},
		{"a ceiling of one never moves", 1, 1, 5, 0, 1, 0},
		{"an idle single P stays", 1, 2, 0, 3, 1, 0},
	} {
		got, calm := nextProcs(c.cur, c.ceiling, c.used, c.calm, 4)
		if got != c.want || calm != c.wantCl {
			t.Errorf("%s: nextProcs(%d, %d, %.2f, %d) = %d, %d; want %d, %d", c.name, c.cur, c.ceiling, c.used, c.calm, got, calm, c.want, c.wantCl)
		}
	}
}

// TestProcScalerFollowsCPU drives the scaler with a CPU clock the test
// advances: busy periods bring the Ps up to the ceiling at once, calm ones
// take them back to one after the calm count, and it stops with its context.
func TestProcScalerFollowsCPU(t *testing.T) {
	var cpu atomic.Int64 // nanoseconds of CPU time; the test adds to it
	var mu sync.Mutex
	var sets []int
	changed := make(chan int, 16)
	s := &procScaler{ceiling: 2, every: 20 * time.Millisecond, calm: 3, log: slog.New(slog.DiscardHandler),
		cpu: func() time.Duration { return time.Duration(cpu.Load()) },
		set: func(n int) { mu.Lock(); sets = append(sets, n); mu.Unlock(); changed <- n }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx) }()
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
	wait(1) // idle from the start: down from the ceiling after 3 calm periods

	// Busy: a clock that runs 1.5 times as fast as the wall clock.
	busy, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stop)
		last := time.Now()
		for {
			select {
			case <-busy:
				return
			case <-time.After(2 * time.Millisecond):
				now := time.Now()
				cpu.Add(int64(now.Sub(last)) * 3 / 2)
				last = now
			}
		}
	}()
	wait(2)
	select {
	case n := <-changed:
		t.Fatalf("set to %d while still busy", n)
	case <-time.After(5 * s.every):
	}
	close(busy)
	<-stop
	wait(1)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sets) != 3 {
		t.Errorf("GOMAXPROCS set %v, want [1 2 1]", sets)
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
