package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Timer slack is how late the kernel may wake a thread from a timed sleep
// so that it can batch wake-ups (50 µs unless the parent set another). Go's
// runtime sleeps briefly on its own: sysmon, the thread that retakes Ps
// from system calls and preempts long-running goroutines, sleeps 20 µs at a
// time while the program is busy, and a system call made after every P
// went idle wakes it and starts that over (golang/go#18236: the interval is
// not configurable). A proxy is exactly such a program — idle between
// connections a few thousand times a second — so sysmon's wake-ups became
// the largest single source of context switches: traced with perf
// (sched_switch, -phases connrate, 2-vCPU VM), 54-62 % of each ztunnel's
// voluntary switches, 1.4 per proxied connection, and 7-9 % of its CPU.
// With a 1 ms slack those sleeps batch with the kernel's other timers.
// Measured (scripts/bench-ab -n 4 -- -phases connrate, hbone-cross-node,
// ZTUNNEL_TIMER_SLACK 50µs → 1ms): connections/s 2 365-2 432 → 2 542-2 903,
// higher in every pair; CPU per connection on the server's node 260-269 →
// 218-245 µs; voluntary switches per connection 2.4-2.5 → 1.4-1.5, where
// upstream's was 1.45 in the same harness.
//
// Timer slack is per thread, inherited by the threads a thread creates and
// kept across execve(2), and sysmon starts before any of ztunnel's code
// runs. So the one way to give it, and every thread after it, the slack
// is to set it on the thread running main and exec the same binary again:
// one execve at start-up, same PID, same arguments and environment (plus a
// marker that stops a second attempt). Go's timers then fire up to the
// slack late — deadlines and idle timeouts here have second-scale values,
// and upstream's tokio runs its timers at millisecond granularity anyway.

// timerSlackMarker is added to the environment of the re-executed process.
const timerSlackMarker = "ZTUNNEL_TIMER_SLACK_APPLIED=1"

// applyTimerSlack execs ztunnel again with slack as every thread's timer
// slack, unless slack is 0 (keep the inherited one) or already in force.
// It returns only when no exec was needed or when it failed; a failure
// leaves the process as it was, with the default slack.
func applyTimerSlack(slack time.Duration, environ []string) error {
	if slack <= 0 {
		return nil
	}
	cur, err := readTimerSlack()
	if err != nil {
		return err
	}
	if cur == slack {
		return nil
	}
	if slices.Contains(environ, timerSlackMarker) {
		return fmt.Errorf("timer slack: %v after re-exec, want %v", cur, slack)
	}
	// The slack set here must be the exec'ing thread's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0); err != nil {
		return fmt.Errorf("timer slack: set %v: %w", slack, err)
	}
	env := append(environ[:len(environ):len(environ)], timerSlackMarker)
	// /proc/self/exe is the running binary even if its file was replaced.
	err = syscall.Exec("/proc/self/exe", os.Args, env)
	// Back to the slack every other thread has.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(cur), 0, 0, 0)
	return fmt.Errorf("timer slack: re-exec: %w", err)
}

// readTimerSlack is the calling thread's timer slack.
func readTimerSlack() (time.Duration, error) {
	cur, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("timer slack: read: %w", err)
	}
	return time.Duration(cur), nil
}

// timerSlack is readTimerSlack for the start-up log and config_dump (0
// when it cannot be read).
func timerSlack() time.Duration {
	d, _ := readTimerSlack()
	return d
}
