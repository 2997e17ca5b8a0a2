package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory budget of the process.
//
// GOMEMLIMIT: when the environment does not set it, ztunnel sets the Go
// runtime's soft memory limit to 90 % of the container's memory limit
// (cgroup v2 memory.max, or v1 memory.limit_in_bytes), so the garbage
// collector works harder as the pod nears its limit instead of the kernel
// OOM-killing it; the remaining 10 % is for memory the Go runtime does not
// count (kernel socket buffers are charged to the cgroup too, thread
// stacks). Without a container limit nothing is set.
//
// Text pages: a Go binary's read-only segments (code, type data, the
// function tables) are file-backed and count in RSS once touched. Start-up
// touches most of them (protobuf descriptor registration of the xDS and CA
// APIs, flag and config parsing, TLS setup), and they then stay mapped for
// the life of the process although the data path uses a small part. Once
// start-up is done, the trimmer drops the process's mappings of those pages;
// what the running proxy needs faults back in from the page cache on
// first use (a minor fault, no I/O), so RSS afterwards is the working set.
// It never touches writable or anonymous memory, nor a page of code that a
// debugger or a uprobe wrote a breakpoint into (trimRegions).

// Fault-around: the kernel answers a fault on a file mapping by also
// mapping every cached page within a 64 KiB window around it
// (fault_around_bytes, a system-wide setting), but never past the edge of
// the mapping (VMA). The linker interleaves what the data path uses with
// what it never runs (type descriptors are ordered by size, the function
// table by package): the bench's burst of 16 new connections took the
// file-backed RSS from ~3 to ~8 MiB in 64 KiB windows, to ~2 MiB when no
// fault could map more than its own page, and RSS holds it until the next
// trim (bench/README.md, "Peak RSS"). splitMappings cuts the read-only
// segments into splitBytes pieces the kernel keeps apart, so a fault maps
// at most splitBytes.

// Trimming runs once start-up is done, right after each metrics scrape,
// shortly after other cold paths that touch many pages (a config dump, a
// new pod, a new HBONE connection and its TLS handshake: trimDelay after
// the last one), every trimEarly during the first trimEarlyFor (in-pod mode
// keeps starting up after run returns: pods arrive, certificates are
// issued, the first HBONE handshakes run), and every trimEvery after that
// for everything else (profiles, xDS pushes). A trim costs the running
// proxy a few hundred minor faults to map its working set again, and
// ~50 µs to read the pagemap of its ~20 MiB of read-only segments: well
// under a millisecond of CPU.
const (
	trimDelay    = 250 * time.Millisecond
	trimEarly    = 500 * time.Millisecond
	trimEarlyFor = time.Minute
	trimEvery    = time.Minute
)

// textTrimmer schedules trims of the executable's read-only mappings.
type textTrimmer struct {
	started time.Time
	// regions are found once: a fixed-address executable's mappings do not
	// move. A trim is then only the madvise calls, so little of the
	// trimmer's own code faults back in after it (parsing /proc/self/maps
	// and the ELF header, and logging, on every trim mapped ~25 faults ×
	// 16 pages of code and data straight back).
	regions []region
	// pagemap is /proc/self/pagemap, kept open (nil: unreadable, trims
	// drop every page). trimMu makes trims take turns over it and guards
	// closed, set by stop.
	pagemap *os.File
	trimMu  sync.Mutex
	closed  bool

	mu      sync.Mutex
	soonT   *time.Timer // guarded by mu: pending trimDelay trim
	everyT  *time.Timer // guarded by mu: the periodic trim
	stopped bool        // guarded by mu
}

func newTextTrimmer(log *slog.Logger) *textTrimmer {
	t := &textTrimmer{started: time.Now(), regions: trimmableRegions(log)}
	if len(t.regions) > 0 {
		pm, err := os.Open("/proc/self/pagemap")
		if err != nil {
			log.Debug("text trims cannot tell breakpoints from code", "error", err)
		}
		t.pagemap = pm
	}
	if n := splitMappings(t.regions, maxMapCount()/splitShareOfMaps); n > 0 {
		log.Debug("text mappings split against fault-around", "pieces", n, "bytes_each", splitBytes)
	}
	t.mu.Lock()
	t.everyT = time.AfterFunc(trimEarly, t.periodic)
	t.mu.Unlock()
	return t
}

// soon trims trimDelay from now unless a trim is already pending.
func (t *textTrimmer) soon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.soonT == nil && !t.stopped {
		t.soonT = time.AfterFunc(trimDelay, func() {
			t.mu.Lock()
			t.soonT = nil
			t.mu.Unlock()
			t.trim()
		})
	}
}

func (t *textTrimmer) periodic() {
	t.trim()
	t.mu.Lock()
	if !t.stopped {
		next := trimEvery
		if time.Since(t.started) < trimEarlyFor {
			next = trimEarly
		}
		t.everyT.Reset(next)
	}
	t.mu.Unlock()
}

func (t *textTrimmer) trim() {
	t.trimMu.Lock()
	defer t.trimMu.Unlock()
	if !t.closed {
		trimRegions(t.regions, t.pagemap)
	}
}

func (t *textTrimmer) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	t.everyT.Stop()
	if t.soonT != nil {
		t.soonT.Stop()
	}
	// A trim whose timer already fired may still be on its way: it finds
	// the trimmer closed and does nothing.
	t.trimMu.Lock()
	t.closed = true
	if t.pagemap != nil {
		t.pagemap.Close()
	}
	t.trimMu.Unlock()
}

// trimmingListener asks for a trim after each accepted connection: for
// HBONE (15008) a new connection means a TLS handshake, cold code.
type trimmingListener struct {
	net.Listener
	t *textTrimmer
}

func (l trimmingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.t.soon()
	}
	return c, err
}

// memLimitFraction of the container limit becomes GOMEMLIMIT.
const memLimitFraction = 0.9

// cgroupLimitFiles are read in order; the first number found is the limit.
var cgroupLimitFiles = []string{
	"/sys/fs/cgroup/memory.max",                   // cgroup v2
	"/sys/fs/cgroup/memory/memory.limit_in_bytes", // cgroup v1
}

// setMemoryLimit applies the GOMEMLIMIT default and returns the limit set
// (0: none).
func setMemoryLimit(environ []string, log *slog.Logger) int64 {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMEMLIMIT=") {
			return 0 // the runtime already applied the operator's value
		}
	}
	limit, file := containerMemoryLimit(cgroupLimitFiles)
	if limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * memLimitFraction)
	debug.SetMemoryLimit(soft)
	log.Info("memory limit from the container", "file", file, "container_bytes", limit, "gomemlimit_bytes", soft)
	return soft
}

// containerMemoryLimit reads the first cgroup limit file holding a number.
// "max" and the v1 "unlimited" value (close to MaxInt64) mean no limit.
func containerMemoryLimit(files []string) (int64, string) {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, f
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return 0, f
		}
		return n, f
	}
	return 0, ""
}

// trimmableRegions returns the mappings of the process's executable that
// trimRegions may drop: its read-only segments, when it is a
// fixed-address executable (else none).
func trimmableRegions(log *slog.Logger) []region {
	exe, err := os.Executable()
	if err != nil || !fixedAddressELF(exe) {
		log.Debug("text trimming off: not a fixed-address executable", "path", exe)
		return nil
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		log.Debug("text trimming off", "error", err)
		return nil
	}
	regions, err := readOnlyMappings(maps, exe)
	if err != nil {
		log.Debug("text trimming off: parse /proc/self/maps", "error", err)
		return nil
	}
	var total uintptr
	for _, r := range regions {
		total += r.end - r.start
	}
	log.Debug("text trimming on", "regions", len(regions), "bytes", total)
	return regions
}

// trimRegions drops the process's mappings of the pages in regions that
// hold the file's bytes, and returns how many bytes of mappings it
// dropped. A page that was written to is a private copy instead: a
// breakpoint that a debugger (ptrace) or a uprobe (perf probe, bpftrace)
// put into the code. Dropping it would map the file's bytes back and
// silently remove the breakpoint, so trimRegions asks pagemap (nil: no
// check) which pages are private copies and leaves them mapped. The
// madvise calls can only fail on an address range that is not mapped
// (EINVAL, ENOMEM), which the regions are not.
func trimRegions(regions []region, pagemap *os.File) int64 {
	var total int64
	drop := func(from, to uintptr) {
		if from >= to {
			return
		}
		// The raw syscall: the range is not Go memory, so no slice of it.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, from, to-from, unix.MADV_DONTNEED); errno == 0 {
			total += int64(to - from)
		}
	}
	page := uintptr(os.Getpagesize())
	var entries [512]uint64 // one pagemap read: 512 pages
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&entries[0])), len(entries)*8)
	for _, r := range regions {
		if pagemap == nil {
			drop(r.start, r.end)
			continue
		}
		keepFrom := r.start // start of the run of pages to drop
		for a := r.start; a < r.end; {
			n := min(uintptr(len(entries)), (r.end-a)/page)
			got, err := unix.Pread(int(pagemap.Fd()), buf[:n*8], int64(a/page*8))
			if err != nil || got < 8 {
				// Unreadable: keep the rest mapped rather than guess.
				drop(keepFrom, a)
				keepFrom = r.end
				break
			}
			for i := range uintptr(got / 8) {
				if privateCopy(entries[i]) {
					drop(keepFrom, a+i*page)
					keepFrom = a + (i+1)*page
				}
			}
			a += uintptr(got/8) * page
		}
		drop(keepFrom, r.end)
	}
	return total
}

// privateCopy reports whether a /proc/<pid>/pagemap entry is a page of a
// private file mapping that no longer holds the file's bytes: present but
// not a file page (bit 61), or swapped out (bit 62; only anonymous pages
// swap). Documented in the kernel's admin-guide/mm/pagemap.
func privateCopy(e uint64) bool {
	const present, swapped, file = 1 << 63, 1 << 62, 1 << 61
	return e&swapped != 0 || (e&present != 0 && e&file == 0)
}

// splitBytes is the most one fault maps in the executable's read-only
// segments once they are split. Four pages: in alternating A/B bench runs
// (-quick, hbone-cross-node, 2026-12-06) the 1000 rps phase's RSS peak was
// 13.0-13.8 MiB unsplit, 10.9 in 8-page pieces, 9.4-9.7 in 4-page, 8.3
// in 2-page and 7.6 in 1-page ones. Each piece is a VMA, ~200 bytes of
// kernel memory: 4 pages make ~1 250 of them for the ~20 MiB of a ztunnel
// binary's read-only segments (~0.25 MiB), where 1 page made 5 000.
const splitBytes = 4 << 12

// splitShareOfMaps: the split may use at most this fraction of the
// process's mapping limit (vm.max_map_count, 65 530 by default), because
// the Go runtime needs new mappings as the heap grows and fails hard when
// the kernel refuses one.
const splitShareOfMaps = 8

// maxMapCount is vm.max_map_count, or 0 when it cannot be read (no split).
func maxMapCount() int {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}

// splitMappings cuts each region into splitBytes pieces and returns how
// many pieces it made: none when that would be more than maxPieces.
// Neighbouring VMAs of one file merge back unless their flags differ, so
// every other piece gets MADV_DONTDUMP: the only effect of that flag is to
// leave the piece out of a core dump, which leaves out an unmodified
// file-backed mapping anyway (coredump_filter's default). The trimmer's
// madvise calls span pieces and keep them apart.
func splitMappings(regions []region, maxPieces int) int {
	total := 0
	for _, r := range regions {
		total += int((r.end - r.start + splitBytes - 1) / splitBytes)
	}
	if total > maxPieces {
		return 0
	}
	pieces := 0
	for _, r := range regions {
		for a, i := r.start, 0; a < r.end; a, i = a+splitBytes, i+1 {
			pieces++
			if i%2 == 0 {
				continue
			}
			n := min(uintptr(splitBytes), r.end-a)
			if _, _, errno := unix.Syscall(unix.SYS_MADVISE, a, n, unix.MADV_DONTDUMP); errno != 0 {
				return pieces // out of VMAs (vm.max_map_count): keep what was split
			}
		}
	}
	return pieces
}

// fixedAddressELF reports whether path is a non-PIE executable (ELF type
// EXEC). A position-independent one has read-only pages that the loader
// wrote relocations into (RELRO): dropping those would restore the
// unrelocated bytes, so the trimmer leaves such a binary alone.
func fixedAddressELF(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Type == elf.ET_EXEC
}

type region struct{ start, end uintptr }

// readOnlyMappings returns the mappings of file path in a /proc/<pid>/maps
// listing that are neither writable nor private-writable: code and
// read-only data, whose pages can always be read again from the file.
func readOnlyMappings(maps []byte, path string) ([]region, error) {
	var out []region
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[5] != path {
			continue
		}
		perms := f[1]
		if len(perms) < 4 || perms[0] != 'r' || perms[1] != '-' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, fmt.Errorf("bad range %q", f[0])
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("bad range %q", f[0])
		}
		out = append(out, region{uintptr(start), uintptr(end)})
	}
	return out, sc.Err()
}
