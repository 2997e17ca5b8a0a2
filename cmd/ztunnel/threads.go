package main

import (
	"context"
	"log/slog"
	"runtime"
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

// Worker threads are a ceiling, not a constant. While the proxy's CPU use
// fits in fewer Ps, procScaler runs it on fewer: with a P idle, the runtime
// wakes a thread to spin looking for work whenever a goroutine becomes
// runnable (a socket became readable), and at a light load it finds none;
// on one P the data path stays on one thread (perf record -a of the 1000
// rps phase: each ztunnel's samples fell on a single thread; context
// switches per request moved only from 2.12 to 2.06). Measured on the
// 2-vCPU VM, eight alternating pairs of bench -quick -scenarios hbone-cross-node
// against the fixed two Ps: CPU per ztunnel at 1000 rps 0.035–0.048
// (median 0.044) against 0.044–0.072 (0.049) vCPU, lower in seven pairs;
// added p99 +73 to +147 µs against +140 to +763, lower in all eight;
// throughput, connections per second and latency beside bulk streams
// unchanged. A fixed single P (GOMAXPROCS=1) made requests beside a
// full-rate bulk stream wait behind the copy (p50 3.5–4.3 ms against
// 2.4–2.7), so the Ps come back as soon as the CPU use says the work needs
// them. The count in use is go_sched_gomaxprocs_threads on :15020/metrics.
const (
	procsEvery = 250 * time.Millisecond // how often CPU use is read
	// procsCalm is how many calm periods in a row halve the Ps: changing
	// GOMAXPROCS stops the world for microseconds, so a short hysteresis
	// costs nothing, and at start-up (busy, at the ceiling) the proxy is
	// down to what it needs about a second after the load is gone.
	procsCalm = 4
	// With cur Ps in use the work needs more above procsBusy × cur cores,
	// and fits in half as many below procsIdle × (half as many).
	procsBusy = 0.5
	procsIdle = 0.25
)

// procScaler keeps GOMAXPROCS between 1 and ceiling, following the CPU time
// the process used in each period.
type procScaler struct {
	ceiling int
	every   time.Duration
	calm    int                  // calm periods in a row before halving
	cpu     func() time.Duration // the process's CPU time so far
	set     func(int)            // sets GOMAXPROCS
	log     *slog.Logger
}

func newProcScaler(ceiling int, log *slog.Logger) *procScaler {
	return &procScaler{ceiling: ceiling, every: procsEvery, calm: procsCalm, cpu: processCPU,
		set: func(n int) { runtime.GOMAXPROCS(n) }, log: log}
}

// run scales until ctx ends, starting from the ceiling (start-up is the
// busy part).
func (s *procScaler) run(ctx context.Context) {
	if s.ceiling <= 1 {
		return
	}
	t := time.NewTicker(s.every)
	defer t.Stop()
	cur, calm := s.ceiling, 0
	last, lastAt := s.cpu(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c := s.cpu()
			used := float64(c-last) / float64(now.Sub(lastAt))
			last, lastAt = c, now
			var n int
			if n, calm = nextProcs(cur, s.ceiling, used, calm, s.calm); n != cur {
				s.set(n)
				s.log.Debug("worker threads in use", "gomaxprocs", n, "was", cur, "cpu_cores", used)
				cur = n
			}
		}
	}
}

// nextProcs returns the Ps for the next period and the calm count, given
// cur Ps in use, the ceiling and the cores used over the last period.
func nextProcs(cur, ceiling int, used float64, calm, calmFor int) (int, int) {
	switch half := max(1, cur/2); {
	case used > procsBusy*float64(cur) && cur < ceiling:
		return min(ceiling, cur*2), 0
	case cur > 1 && used < procsIdle*float64(half):
		if calm+1 >= calmFor {
			return half, 0
		}
		return cur, calm + 1
	default:
		return cur, 0
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
