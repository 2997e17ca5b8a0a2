package workers

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPoolReusesGoroutines(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := New(ctx, 2)
	// One job at a time: after the first, every job finds the kept
	// goroutine waiting, so all run on the same one.
	ids := map[uint64]bool{}
	for range 20 {
		ch := make(chan uint64)
		waitFor(t, "a waiting goroutine", func() bool { return len(ids) == 0 || parked() == 1 })
		p.Go(func() { ch <- goid() })
		ids[<-ch] = true
	}
	if len(ids) != 1 {
		t.Errorf("20 sequential jobs ran on %d goroutines, want 1", len(ids))
	}
}

func TestPoolKeepsAtMostMax(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := New(ctx, 3)
	// A burst of 10 concurrent jobs: all run at once, and only 3 of their
	// goroutines stay.
	var started, release sync.WaitGroup
	started.Add(10)
	release.Add(1)
	for range 10 {
		p.Go(func() { started.Done(); release.Wait() })
	}
	started.Wait()
	before := runtime.NumGoroutine() // the 10 jobs' goroutines included
	release.Done()
	waitFor(t, "the burst's extra goroutines to end", func() bool {
		return p.kept.Load() == 3 && runtime.NumGoroutine() <= before-7
	})
	// The context ends the kept ones (goleak checks nothing is left).
	cancel()
	waitFor(t, "kept goroutines to end", func() bool { return p.kept.Load() == 0 })
	// After that every job still runs, on a goroutine of its own.
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	<-ran
	waitFor(t, "the late job's goroutine to end", func() bool { return p.kept.Load() == 0 })
}

// parked counts kept goroutines blocked in Pool.run's select, read from a
// dump of every goroutine. A goroutine shown blocked there has queued on
// the jobs channel, so Pool.Go's send finds it; a counter bumped just
// before the select did not say that, and under load a job sent in between
// went to a new goroutine, which then stayed kept too (CI, 2026-12-06).
func parked() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, rest, _ := strings.Cut(g, "\n")
		top, _, _ := strings.Cut(rest, "\n")
		if strings.Contains(header, "[select") && strings.Contains(top, "workers.(*Pool).run(") {
			n++
		}
	}
	return n
}

// goid reads the running goroutine's id from its stack header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	// "goroutine 123 [running]:"
	var id uint64
	for _, c := range b[len("goroutine "):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

func TestPoolIdleGoroutinesEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := New(ctx, 4)
	p.idle = 200 * time.Millisecond
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	waitFor(t, "a kept goroutine", func() bool { return p.kept.Load() == 1 })
	// Without a next job it ends by itself, the context still live.
	waitFor(t, "the idle goroutine to end", func() bool { return p.kept.Load() == 0 })
	if ctx.Err() != nil {
		t.Fatal("context ended")
	}
}
