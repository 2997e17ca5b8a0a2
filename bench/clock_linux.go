package main

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// schedule sends 0..n-1 on ch, index i at start+i*interval, then closes ch.
// It sets *start before the first send, so a receiver may read it. ch must have capacity n so the schedule never waits for
// the workers: a request whose worker is busy waits in ch and its wait
// counts in its latency (open loop, no coordinated omission).
//
// Go's timers are too coarse for this: when the process is idle the
// runtime sleeps in epoll_wait with a millisecond timeout, so a wake-up can
// be up to ~1 ms late. The schedule therefore runs on its own OS thread
// sleeping in clock_nanosleep(TIMER_ABSTIME) with a 1 ns timer slack
// (the default 50 µs would add up to 50 µs to each send).
func schedule(ctx context.Context, n int, interval time.Duration, ch chan<- int, start *time.Time) {
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
			req := unix.NsecToTimespec(base + int64(i)*int64(interval))
			for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &req, nil) == unix.EINTR {
			}
			ch <- i
		}
	}()
	<-started
}
