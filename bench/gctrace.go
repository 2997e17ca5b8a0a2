package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Whether a phase's slowest requests are the garbage collector's doing is
// read off the ztunnels' own GC trace: every ztunnel runs with gcTraceEnv,
// which makes a Go runtime print one line per cycle to stderr (the
// ztunnel's log), with the cycle's start relative to the runtime's start
// and its wall time. A binary that is not Go (a -peer) prints none.
const gcTraceEnv = "GODEBUG=gctrace=1"

// withGCTrace adds the GC trace to env: to the last GODEBUG there (the
// one in force) unless it sets gctrace itself, else as GODEBUG.
func withGCTrace(env []string) []string {
	for i := len(env) - 1; i >= 0; i-- {
		v, ok := strings.CutPrefix(env[i], "GODEBUG=")
		if !ok {
			continue
		}
		if !strings.Contains(v, "gctrace=") {
			env = slices.Clone(env)
			env[i] = strings.TrimSuffix(env[i], ",") + ",gctrace=1"
			if v == "" {
				env[i] = gcTraceEnv
			}
		}
		return env
	}
	return append(env, gcTraceEnv)
}

// gcCycle is one collection: when it began relative to the process's
// runtime start, and how long it ran (sweep termination, concurrent mark,
// mark termination: wall time).
type gcCycle struct {
	at, dur time.Duration
}

// parseGCTrace returns the cycles in a stretch of a log, reading lines such
// as "gc 7 @12.345s 0%: 0.029+0.99+0.001 ms clock, …". Other lines and lines
// it cannot read are skipped.
func parseGCTrace(b []byte) []gcCycle {
	var cs []gcCycle
	for line := range bytes.Lines(b) {
		if !bytes.HasPrefix(line, []byte("gc ")) {
			continue
		}
		f := strings.Fields(string(line))
		if len(f) < 6 || !strings.HasPrefix(f[2], "@") || !strings.HasSuffix(f[2], "s") {
			continue
		}
		at, err := strconv.ParseFloat(strings.TrimSuffix(f[2][1:], "s"), 64)
		if err != nil {
			continue
		}
		i := slices.Index(f, "clock,")
		if i < 2 || f[i-1] != "ms" {
			continue
		}
		var ms float64
		ok := true
		for part := range strings.SplitSeq(f[i-2], "+") {
			v, err := strconv.ParseFloat(part, 64)
			if err != nil {
				ok = false
				break
			}
			ms += v
		}
		if !ok {
			continue
		}
		cs = append(cs, gcCycle{at: time.Duration(at * float64(time.Second)), dur: time.Duration(ms * float64(time.Millisecond))})
	}
	return cs
}

// logSize is where a log ends now: the offset its next phase is read from.
func logSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom returns a file's bytes from off on.
func readFrom(path string, off int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// gcWindow is a stretch of wall-clock time during which a cycle may have
// been running.
type gcWindow struct{ from, to time.Time }

// gcSlack widens each cycle's window: the process's start is known to a
// clock tick (10 ms, /proc/<pid>/stat) and the runtime starts ~1 ms after
// the process; the trace gives the cycle's start to the millisecond.
const gcSlack = time.Second/clockTicks + 2*time.Millisecond

// processStart is the wall-clock time the process began, to a clock tick
// (rounded down): its start in ticks since boot, placed on the wall clock by
// reading CLOCK_BOOTTIME and the wall clock together.
func processStart(pid int) (time.Time, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	ticks, err := parseStartTicks(string(b))
	if err != nil {
		return time.Time{}, err
	}
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, fmt.Errorf("bench: CLOCK_BOOTTIME: %w", err)
	}
	sinceBoot := time.Duration(ts.Nano())
	return now.Add(-sinceBoot + time.Duration(ticks)*time.Second/clockTicks), nil
}

// parseStartTicks returns field 22 of /proc/<pid>/stat (starttime).
func parseStartTicks(stat string) (uint64, error) {
	f, err := statFields(stat, 20)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: /proc stat starttime: %w", err)
	}
	return v, nil
}

// windows places cycles of a process that started at start on the wall
// clock, each widened by gcSlack after its end.
func windows(start time.Time, cs []gcCycle) []gcWindow {
	ws := make([]gcWindow, len(cs))
	for i, c := range cs {
		ws[i] = gcWindow{from: start.Add(c.at), to: start.Add(c.at + c.dur + gcSlack)}
	}
	return ws
}

// GCReport says how the 1000 rps phase's slowest requests relate to the
// collections the ztunnels on its path ran meanwhile.
type GCReport struct {
	Cycles  int     `json:"cycles"`   // on every ztunnel of the path together
	ClockMS float64 `json:"clock_ms"` // their summed wall time
	// Slow is how many requests took at least the phase's p99, and
	// SlowNearGC how many of those were in flight during a cycle's window
	// (the cycle, gcSlack after it, and the time its start is uncertain).
	Slow       int `json:"slow_requests"`
	SlowNearGC int `json:"slow_requests_near_gc"`
	// NearGC counts all requests in flight during a window, and
	// P99AwayFromGC is the p99 (µs) of the others: if the collector drove
	// the tail, this is where it would drop.
	NearGC        int     `json:"requests_near_gc"`
	P99AwayFromGC float64 `json:"p99_away_from_gc_us"`
}

// gcOverlap compares the requests of an open loop with the collection
// windows: which of them were in flight, from due time to response, while
// a cycle may have been running.
func gcOverlap(lat openLoopResult, ws []gcWindow, p99 time.Duration) GCReport {
	var rep GCReport
	away := make([]time.Duration, 0, len(lat.each))
	for i, d := range lat.each {
		from := lat.start.Add(lat.slots.due(i))
		to := from.Add(d)
		near := false
		for _, w := range ws {
			if from.Before(w.to) && to.After(w.from) {
				near = true
				break
			}
		}
		slow := d >= p99
		switch {
		case near:
			rep.NearGC++
		default:
			away = append(away, d)
		}
		if slow {
			rep.Slow++
			if near {
				rep.SlowNearGC++
			}
		}
	}
	rep.P99AwayFromGC = summarize(away).P99
	return rep
}

// gcReport reads the GC trace each node's ztunnel wrote to its log after
// offs (taken when the phase began) and relates it to the phase's requests.
func (r *runner) gcReport(nodes []int, offs []int64, lat openLoopResult) (*GCReport, error) {
	var ws []gcWindow
	var rep GCReport
	for i, ni := range nodes {
		n := r.node(ni)
		b, err := readFrom(n.LogPath, offs[i])
		if err != nil {
			return nil, fmt.Errorf("bench: node%d GC trace: %w", ni, err)
		}
		start, err := processStart(n.Pid())
		if err != nil {
			return nil, fmt.Errorf("bench: node%d start time: %w", ni, err)
		}
		cs := parseGCTrace(b)
		for _, c := range cs {
			rep.ClockMS += float64(c.dur) / float64(time.Millisecond)
		}
		rep.Cycles += len(cs)
		ws = append(ws, windows(start, cs)...)
	}
	o := gcOverlap(lat, ws, time.Duration(math.Round(lat.latency.P99*float64(time.Microsecond))))
	o.Cycles, o.ClockMS = rep.Cycles, rep.ClockMS
	return &o, nil
}
