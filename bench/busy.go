package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A run on a busy machine is silently worse (issue #14, point 3): the
// harness records how loaded the machine was and how precisely it could
// keep its own schedule, at the start and at the end, and says so when
// either makes the figures doubtful.
const (
	// busyLoadPerCore: load at start above this many runnable tasks per
	// core, with busyCPUPerCore of the CPUs in use, marks the run busy.
	// The runnable count alone is not enough: sampled from a Go process it
	// reads about one task more than there is on an idle machine (0.9-1.1
	// on 2 idle cores, 0.01-0.06 of them in use: the runtime wakes a
	// second thread around the sampling goroutine's sleeps and reads), so
	// by itself it flagged calm runs and made -quick wait for nothing.
	busyLoadPerCore = 0.5
	busyCPUPerCore  = 0.25
	// loadWindow: the load is the number of runnable tasks averaged over
	// this window, sampled every loadSampleEvery. The kernel's own load
	// average is a one-minute exponential average: a build that ended 20 s
	// ago still shows in it, and one that started 5 s ago barely does.
	loadWindow      = time.Second
	loadSampleEvery = 20 * time.Millisecond
	// settleBudget bounds how long -quick waits for the machine to settle.
	settleBudget = 20 * time.Second
	// lagProbe: length of the send-lag probe at the start and end. At
	// 1000/s its p99 is the 10th-worst of 1000 sends: one stray hiccup of
	// the machine does not make a run "busy" (with 0.3 s, one did).
	lagProbe = time.Second
)

// LoadSample is the machine's load over one window.
type LoadSample struct {
	// Runnable is the number of runnable tasks (the 4th field of
	// /proc/loadavg, not counting the sampling thread) averaged over the
	// window: an instantaneous load average.
	Runnable float64 `json:"runnable"`
	// CPUBusy is the non-idle CPU time over the window, in cores
	// (/proc/stat).
	CPUBusy float64 `json:"cpu_busy_cores"`
	// LoadAvg1 is the kernel's one-minute load average at the end.
	LoadAvg1 float64 `json:"loadavg_1m"`
	Window   float64 `json:"window_s"`
}

// loaded reports whether s is a busy machine: more runnable tasks than
// busyLoadPerCore and more CPU in use than busyCPUPerCore, per core.
func (s LoadSample) loaded() bool {
	cores := float64(runtime.NumCPU())
	return s.Runnable > busyLoadPerCore*cores && s.CPUBusy > busyCPUPerCore*cores
}

// sampleLoad measures the load over loadWindow.
func sampleLoad(ctx context.Context) (LoadSample, error) {
	busy0, total0, err := readCPUStat()
	if err != nil {
		return LoadSample{}, err
	}
	t0 := time.Now()
	var sum float64
	n := 0
	for time.Since(t0) < loadWindow {
		r, _, err := readLoadavg()
		if err != nil {
			return LoadSample{}, err
		}
		sum += max(0, r-1) // the reading thread is running while it reads
		n++
		if err := sleepCtx(ctx, loadSampleEvery); err != nil {
			return LoadSample{}, err
		}
	}
	busy1, total1, err := readCPUStat()
	if err != nil {
		return LoadSample{}, err
	}
	_, la1, err := readLoadavg()
	if err != nil {
		return LoadSample{}, err
	}
	s := LoadSample{Runnable: sum / float64(n), LoadAvg1: la1, Window: time.Since(t0).Seconds()}
	if total1 > total0 {
		// /proc/stat's first line adds up every CPU: the busy share of it
		// times the number of CPUs is in cores.
		s.CPUBusy = float64(busy1-busy0) / float64(total1-total0) * float64(runtime.NumCPU())
	}
	return s, nil
}

// readLoadavg returns the runnable task count and the one-minute average
// from /proc/loadavg ("0.52 0.58 0.59 2/345 6789").
func readLoadavg() (runnable, avg1 float64, err error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, 0, fmt.Errorf("bench: read /proc/loadavg: %w", err)
	}
	return parseLoadavg(string(b))
}

func parseLoadavg(s string) (runnable, avg1 float64, err error) {
	f := strings.Fields(s)
	if len(f) < 4 {
		return 0, 0, fmt.Errorf("bench: /proc/loadavg: %q: want ≥ 4 fields", s)
	}
	r, _, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, 0, fmt.Errorf("bench: /proc/loadavg: %q: no running/total field", s)
	}
	ri, err1 := strconv.Atoi(r)
	a, err2 := strconv.ParseFloat(f[0], 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("bench: /proc/loadavg: %q: not numbers", s)
	}
	return float64(ri), a, nil
}

// readCPUStat returns busy and total jiffies of all CPUs from /proc/stat.
func readCPUStat() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("bench: read /proc/stat: %w", err)
	}
	return parseCPUStat(string(b))
}

// parseCPUStat reads the "cpu" line: user nice system idle iowait irq
// softirq steal (guest time is already in user). Idle and iowait are not
// busy.
func parseCPUStat(s string) (busy, total uint64, err error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("bench: /proc/stat: first line %q", line)
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: /proc/stat: %w", err)
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total, nil
}

// MachineLoad is what results.json's machine records about load.
type MachineLoad struct {
	Busy        bool       `json:"busy"`
	BusyReasons []string   `json:"busy_reasons,omitempty"`
	LoadStart   LoadSample `json:"load_start"`
	LoadEnd     LoadSample `json:"load_end"`
	// Send lag of the harness's own schedule with nothing else to do, at
	// the start and the end: the precision it could keep its schedule to.
	LagStart Latency `json:"harness_lag_start_us"`
	LagEnd   Latency `json:"harness_lag_end_us"`
	// SettleWait: how long -quick waited for the machine to settle.
	SettleWait float64 `json:"settle_wait_s"`
}

// settle measures the load and, when wait, repeats for up to settleBudget
// until it is below the busy threshold. It returns the last sample.
func settle(ctx context.Context, wait bool, log func(string, ...any)) (LoadSample, time.Duration, error) {
	t0 := time.Now()
	said := false
	for {
		s, err := sampleLoad(ctx)
		if err != nil {
			return s, time.Since(t0), err
		}
		if !wait || !s.loaded() {
			return s, time.Since(t0), nil
		}
		if time.Since(t0)+loadWindow > settleBudget {
			log("machine still busy after %.0fs (%.2f runnable tasks): starting anyway", time.Since(t0).Seconds(), s.Runnable)
			return s, time.Since(t0), nil
		}
		if !said {
			log("machine busy (%.2f runnable tasks, %.2f cores in use, %d cores): waiting up to %v for it to settle", s.Runnable, s.CPUBusy, runtime.NumCPU(), settleBudget)
			said = true
		}
	}
}

// probeLag runs the open-loop schedule for lagProbe at rate with workers
// that do nothing but note how late they started: the harness's own
// precision, without any network.
func probeLag(ctx context.Context, rate int) Latency {
	sl := slots{interval: time.Second / time.Duration(rate)}
	n := max(1, int(lagProbe/sl.interval))
	lag := make([]time.Duration, n)
	ch := make(chan int, n)
	var start time.Time
	var wg sync.WaitGroup
	ready := make(chan struct{}, latencyConns)
	for range latencyConns {
		wg.Go(func() {
			ready <- struct{}{}
			for i := range ch {
				lag[i] = time.Since(start.Add(sl.due(i)))
			}
		})
	}
	for range latencyConns {
		<-ready
	}
	schedule(ctx, n, sl, ch, &start)
	wg.Wait()
	return summarize(lag)
}

// judgeBusy sets Busy and its reasons from the start load and the lag
// probes against direct's reused-connection p99 (0: direct or its latency
// phase not run).
func (m *MachineLoad) judgeBusy(directP99 float64) {
	m.Busy, m.BusyReasons = false, nil
	if m.LoadStart.loaded() {
		m.BusyReasons = append(m.BusyReasons, fmt.Sprintf("load at start %.2f runnable tasks > %.1f per core and %.2f cores busy > %.2f per core, × %d cores (1-min load average %.2f)",
			m.LoadStart.Runnable, busyLoadPerCore, m.LoadStart.CPUBusy, busyCPUPerCore, runtime.NumCPU(), m.LoadStart.LoadAvg1))
	}
	if lag := max(m.LagStart.P99, m.LagEnd.P99); directP99 > 0 && lag > directP99 {
		m.BusyReasons = append(m.BusyReasons, fmt.Sprintf("the harness's own send lag p99 %.0f µs (start %.0f, end %.0f) exceeds direct's p99 %.0f µs",
			lag, m.LagStart.P99, m.LagEnd.P99, directP99))
	}
	m.Busy = len(m.BusyReasons) > 0
}

// markBusy notes on every evaluated target of a busy run that its figure
// is doubtful: a noisy unloaded phase, for one, can make a ratio target
// look met.
func markBusy(ts []Target, busy bool) {
	if !busy {
		return
	}
	for i := range ts {
		if strings.HasPrefix(ts[i].Note, notMeasured) {
			continue
		}
		ts[i].Note = strings.TrimPrefix(ts[i].Note+"; machine busy: doubtful", "; ")
	}
}
