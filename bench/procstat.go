package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/demo"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports (the kernel fixes it for
// user space regardless of CONFIG_HZ).
const clockTicks = 100

// statFields returns the fields of /proc/<pid>/stat after the command
// name (f[0] is field 3, state), at least n of them.
func statFields(stat string, n int) ([]string, error) {
	// The command name is in parentheses and may contain spaces or ')'.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, errors.New("bench: /proc stat: no ')'")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < n {
		return nil, fmt.Errorf("bench: /proc stat: %d fields after the name, want ≥ %d", len(f), n)
	}
	return f, nil
}

// parseStatCPU returns utime+stime from the text of /proc/<pid>/stat.
func parseStatCPU(stat string) (time.Duration, error) {
	// utime and stime are fields 14 and 15.
	f, err := statFields(stat, 13)
	if err != nil {
		return 0, err
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("bench: /proc stat: %w", err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// processCPU is the user+system CPU time the process has used, in
// USER_HZ ticks (10 ms): exited threads included.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: cpu of %d: %w", pid, err)
	}
	return parseStatCPU(string(b))
}

// threadsCPU is the time the process's live threads have spent on a CPU,
// to the nanosecond (the first field of each /proc/<pid>/task/*/schedstat;
// the sum processCPU rounds to ticks, less what exited threads took with
// them). ok is false when the kernel has no schedstat (not even the main
// thread's).
func threadsCPU(pid int) (d time.Duration, ok bool) {
	main, bad := strconv.Itoa(pid), false
	err := eachThread(pid, "schedstat", func(tid string, b []byte) {
		f := strings.Fields(string(b))
		if len(f) == 0 {
			bad = true
			return
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			bad = true
			return
		}
		ok = ok || tid == main
		d += time.Duration(ns)
	})
	return d, err == nil && ok && !bad
}

// eachThread calls fn with the content of /proc/<pid>/task/<tid>/<file>
// for every thread of pid that is still there when its file is read.
func eachThread(pid int, file string, fn func(tid string, b []byte)) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("bench: threads of %d: %w", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/%s", pid, t.Name(), file))
		if err != nil {
			continue // the thread exited meanwhile
		}
		fn(t.Name(), b)
	}
	return nil
}

// cpuSpent is the CPU time a process spent between two readings of
// processCPU (ticks) and threadsCPU (threads): the threads' exact figure,
// unless threads that exited in between took more than two ticks with
// them, which only the tick count still holds. A 1 s phase at 0.03 vCPU
// is 3 ticks: tick counts alone read 0.02-0.04.
func cpuSpent(ticks0, ticks1, threads0, threads1 time.Duration, exact bool) time.Duration {
	byTicks := ticks1 - ticks0
	if !exact {
		return byTicks
	}
	byThreads := threads1 - threads0
	if byTicks-byThreads > 2*time.Second/clockTicks {
		return byTicks
	}
	return max(byThreads, 0)
}

// parseStatusKB returns the value of a "Key:   N kB" line of
// /proc/<pid>/status, in bytes.
func parseStatusKB(status, key string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("bench: /proc status: bad %s line %q", key, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: /proc status: %s: %w", key, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("bench: /proc status: no %s line", key)
}

// rssFigures is one read of a process's memory counters, in bytes: the
// resident set (VmRSS), its anonymous part (RssAnon) and the kernel's
// high-water mark of the resident set (VmHWM; see resetPeakRSS).
type rssFigures struct{ rss, anon, hwm int64 }

// readRSS reads the process's rssFigures from /proc/<pid>/status.
func readRSS(pid int) (rssFigures, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return rssFigures{}, fmt.Errorf("bench: rss of %d: %w", pid, err)
	}
	var f rssFigures
	for _, kv := range []struct {
		key string
		v   *int64
	}{{"VmRSS", &f.rss}, {"RssAnon", &f.anon}, {"VmHWM", &f.hwm}} {
		if *kv.v, err = parseStatusKB(string(b), kv.key); err != nil {
			return rssFigures{}, err
		}
	}
	return f, nil
}

// resetPeakRSS sets the process's VmHWM to its current VmRSS (writing 5 to
// /proc/<pid>/clear_refs, Linux ≥ 4.0; it touches no page bits), so VmHWM
// read later is the peak since this call: every peak, with no sampling
// thread waking up beside the load it measures.
func resetPeakRSS(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("bench: reset peak rss of %d: %w", pid, err)
	}
	return nil
}

// openFDs counts the process's open file descriptors.
func openFDs(pid int) (int, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: fds of %d: %w", pid, err)
	}
	return len(es), nil
}

// openFilesLimit is the soft "Max open files" of a process.
func openFilesLimit(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max open files") {
			if f := strings.Fields(l[len("Max open files"):]); len(f) >= 1 {
				return f[0], nil
			}
		}
	}
	return "", errors.New("bench: no Max open files line")
}

// sumMetric adds up every sample of the named metric in Prometheus text
// exposition (any labels).
func sumMetric(text []byte, name string) (float64, bool) {
	var sum float64
	found := false
	for line := range bytes.Lines(text) {
		line = bytes.TrimSpace(line)
		if !bytes.HasPrefix(line, []byte(name)) {
			continue
		}
		rest := line[len(name):]
		if len(rest) == 0 || (rest[0] != '{' && rest[0] != ' ') {
			continue // a longer name with this prefix
		}
		if rest[0] == '{' {
			j := bytes.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

// nodeMetrics are the figures the harness reads from a ztunnel's 15020.
type nodeMetrics struct {
	opened    float64 // istio_tcp_connections_opened_total, all label sets
	hasOpened bool    // the metric was there at all
	heapInuse float64 // go_memstats_heap_inuse_bytes
	stack     float64 // go_memstats_stack_inuse_bytes
	// goMem: both Go memory metrics were there (ours always; a -peer in
	// another language has none).
	goMem bool
}

func scrape(ctx context.Context, n *demo.MeshNode) (nodeMetrics, error) {
	status, body, err := n.Get(ctx, "127.0.0.1:15020", "/metrics", 5*time.Second)
	if err != nil {
		return nodeMetrics{}, fmt.Errorf("bench: node%d metrics: %w", n.Index, err)
	}
	if status != 200 {
		return nodeMetrics{}, fmt.Errorf("bench: node%d metrics: status %d", n.Index, status)
	}
	var m nodeMetrics
	m.opened, m.hasOpened = sumMetric(body, "istio_tcp_connections_opened_total")
	var ok1, ok2 bool
	m.heapInuse, ok1 = sumMetric(body, "go_memstats_heap_inuse_bytes")
	m.stack, ok2 = sumMetric(body, "go_memstats_stack_inuse_bytes")
	m.goMem = ok1 && ok2
	return m, nil
}

// gc makes the ztunnel run a garbage collection (the heap profile
// endpoint's gc=1), so heap figures count live memory only.
func gc(ctx context.Context, n *demo.MeshNode) error {
	status, _, err := n.Get(ctx, "127.0.0.1:15000", "/debug/pprof/heap?gc=1", 10*time.Second)
	if err == nil && status != 200 {
		err = fmt.Errorf("status %d", status)
	}
	if err != nil {
		return fmt.Errorf("bench: node%d gc: %w", n.Index, err)
	}
	return nil
}

// countEstablished counts ESTABLISHED IPv4 TCP sockets to remotePort in
// the namespace of ns (read from a thread inside it).
func countEstablished(ns *nstest.NS, remotePort uint16) (int, error) {
	var b []byte
	err := ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/tcp")
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("bench: read tcp table of %s: %w", ns.Name, err)
	}
	return parseEstablished(b, remotePort), nil
}

// parseEstablished counts lines of a /proc/net/tcp table in state 01
// (ESTABLISHED) whose remote port is port.
func parseEstablished(table []byte, port uint16) int {
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for line := range bytes.Lines(table) {
		f := strings.Fields(string(line))
		// sl local_address rem_address st ...
		if len(f) < 4 || f[3] != "01" {
			continue
		}
		if strings.HasSuffix(f[2], want) {
			n++
		}
	}
	return n
}

// Switches counts a process's context switches and read/write-family
// system calls. On the development VM a thread wake-up costs ≈ 25 µs, so
// context switches per request are the main driver of CPU per request.
type Switches struct {
	Voluntary    int64 // blocked and woke up again (futex, epoll, read)
	Nonvoluntary int64 // preempted
	Syscalls     int64 // syscr + syscw of /proc/<pid>/io: read/write-family calls only (not epoll, futex, sendmsg)
}

// processSwitches sums the context switches of every thread of pid
// (/proc/<pid>/status shows the main thread's only; a thread that exited
// takes its count with it, and Go's threads seldom exit) and reads its
// syscall counts (/proc/<pid>/io already includes exited threads).
func processSwitches(pid int) (Switches, error) {
	var s Switches
	err := eachThread(pid, "status", func(_ string, b []byte) {
		v, nv := parseCtxSwitches(string(b))
		s.Voluntary += v
		s.Nonvoluntary += nv
	})
	if err != nil {
		return s, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return s, fmt.Errorf("bench: io of %d: %w", pid, err)
	}
	s.Syscalls = parseIOSyscalls(string(b))
	return s, nil
}

// parseCtxSwitches reads voluntary_ctxt_switches and
// nonvoluntary_ctxt_switches from a /proc status text (0 when absent).
func parseCtxSwitches(status string) (vol, nonvol int64) {
	for line := range strings.Lines(status) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "voluntary_ctxt_switches":
			vol = n
		case "nonvoluntary_ctxt_switches":
			nonvol = n
		}
	}
	return vol, nonvol
}

// parseIOSyscalls is syscr + syscw of a /proc/<pid>/io text.
func parseIOSyscalls(io string) int64 {
	var n int64
	for line := range strings.Lines(io) {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "syscr" || k == "syscw") {
			x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			n += x
		}
	}
	return n
}
