package main

import (
	"log/slog"
	"runtime"
	"strings"
)

// defaultWorkerThreads is upstream's ZTUNNEL_WORKER_THREADS default. A node
// proxy needs few threads; more Ps than that mostly add wake-ups (each a
// context switch, tens of µs on a VM) as idle threads are started to look
// for work, which is what an idle-most-of-the-time proxy does all day.
const defaultWorkerThreads = 2

// setWorkerThreads sets GOMAXPROCS from ZTUNNEL_WORKER_THREADS (upstream's
// knob; configured is 0 when unset) unless GOMAXPROCS itself is set. The
// default never exceeds the runtime's own choice, which already follows
// the container's CPU limit. It returns the value in force.
func setWorkerThreads(environ []string, configured int, log *slog.Logger) int {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return runtime.GOMAXPROCS(0)
		}
	}
	n := configured
	if n == 0 {
		n = min(defaultWorkerThreads, runtime.GOMAXPROCS(0))
	}
	if prev := runtime.GOMAXPROCS(n); prev != n {
		log.Info("worker threads", "gomaxprocs", n, "was", prev)
	}
	return n
}
