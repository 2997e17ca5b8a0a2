package main

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// slots is an open loop's send schedule: request i is due at i×interval
// after the start or, jittered, at a pseudo-random point of that slot
// (same rate, irregular gaps of 0 to 2 intervals).
//
// The profile loads are jittered. An exact 1 ms period divides the
// kernel's scheduler tick (4 ms here, HZ=250), so every request of a phase
// met the tick at the same point of its path, and the tick is what
// expires the per-thread CPU timers behind Go's CPU profiler: a ztunnel
// that was never on the CPU at a tick was never sampled. -profile-phase
// rps came back with 0 samples in half the runs where each ztunnel spent
// ~300 ms; jittered, 230–370 ms in 5 of 5. The measured phases keep the exact
// period, so their figures stay comparable with earlier runs.
type slots struct {
	interval time.Duration
	jitter   bool
}

// due is request i's send time relative to the start.
func (s slots) due(i int) time.Duration {
	d := time.Duration(i) * s.interval
	if s.jitter && s.interval > 0 {
		d += time.Duration(splitmix64(uint64(i)) % uint64(s.interval))
	}
	return d
}

// splitmix64 is a stateless mixer: a request's jitter is a function of its
// index alone, so the workers and the schedule agree on it without
// sharing a generator.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// schedule sends 0..n-1 on ch, index i at start+s.due(i), then closes ch.
// It sets *start before the first send, so a receiver may read it. ch must have capacity n so the schedule never waits for
// the workers: a request whose worker is busy waits in ch and its wait
// counts in its latency (open loop, no coordinated omission).
//
// Go's timers are too coarse for this: when the process is idle the
// runtime sleeps in epoll_wait with a millisecond timeout, so a wake-up can
// be up to ~1 ms late. The schedule therefore runs on its own OS thread
// sleeping in clock_nanosleep(TIMER_ABSTIME) with a 1 ns timer slack
// (the default 50 µs would add up to 50 µs to each send).
func schedule(ctx context.Context, n int, s slots, ch chan<- int, start *time.Time) {
	started := make(chan struct{})
	go func() {
		defer close(ch)
		// Restore the slack and unlock rather than let the thread die with
		// the goroutine: a thread that exits sends Pdeathsig to any child
		// it once started (the ztunnels are started from pooled threads).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if old, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0); err == nil {
			defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(old), 0, 0, 0)
		}
		_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			panic("bench: clock_gettime: " + err.Error()) // cannot fail on Linux
		}
		// Go's monotonic clock is CLOCK_MONOTONIC too: both readings name
		// the same instant to within a microsecond.
		base := ts.Nano()
		*start = time.Now()
		close(started)
		for i := 0; i < n && ctx.Err() == nil; i++ {
			req := unix.NsecToTimespec(base + int64(s.due(i)))
			for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &req, nil) == unix.EINTR {
			}
			ch <- i
		}
	}()
	<-started
}
