package hbone

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// syscalls returns the process's read and write syscall counts
// (/proc/self/io), to report syscalls per MiB moved (both ends are in
// this process). Zeros when unavailable.
func syscalls() (r, w float64) {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		n, _ := strconv.ParseFloat(v, 64)
		switch k {
		case "syscr":
			r = n
		case "syscw":
			w = n
		}
	}
	return r, w
}

// cpuTime is the process's user+system CPU time. On a shared machine it
// is a steadier measure of cost than wall-clock throughput.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type costMeter struct {
	r, w float64
	cpu  time.Duration
}

func startCost() costMeter {
	r, w := syscalls()
	return costMeter{r: r, w: w, cpu: cpuTime()}
}

// report reports syscalls and CPU time (both ends) per MiB moved.
func (m costMeter) report(b *testing.B, total int64) {
	r1, w1 := syscalls()
	cpu := cpuTime() - m.cpu
	mib := float64(total) / (1 << 20)
	if mib <= 0 {
		return
	}
	if r1 > 0 {
		b.ReportMetric((r1-m.r)/mib, "reads/MiB")
		b.ReportMetric((w1-m.w)/mib, "writes/MiB")
	}
	b.ReportMetric(float64(cpu.Microseconds())/mib, "cpu-µs/MiB")
}

// Benchmarks compare HBONE (TLS 1.3 + HTTP/2 CONNECT over loopback) with
// plain TCP over loopback in the same run. The HBONE server here answers
// the stream itself (no upstream hop), so the ratio is the cost of the
// tunnel alone.

const benchChunk = 256 << 10 // the proxy's large copy buffer

func BenchmarkRoundTrip(b *testing.B) {
	e := newEnv(b, echoHandler, envOpts{})
	s, err := e.pool.Connect(testCtx(b), e.key, "127.0.0.1:80", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchRoundTrip(b, s)
	s.CloseWrite()
	io.Copy(io.Discard, s)
}

func BenchmarkRoundTripTCP(b *testing.B) {
	addr := startTCP(b, echoTCP)
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	benchRoundTrip(b, c)
}

func benchRoundTrip(b *testing.B, c io.ReadWriter) {
	msg := make([]byte, 1024)
	got := make([]byte, 1024)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, got); err != nil {
			b.Fatal(err)
		}
	}
}

// sinkHandler reads the stream to EOF and answers the byte count; with a
// "x-bench-download: N" header it instead writes N bytes of zeros.
func sinkHandler(ctx context.Context, req *Request) {
	st, err := req.Accept(nil)
	if err != nil {
		return
	}
	defer st.Close()
	if n, err := strconv.ParseInt(req.Header.Get("x-bench-download"), 10, 64); err == nil {
		buf := make([]byte, benchChunk)
		for ; n > 0; n -= int64(len(buf)) {
			if _, err := st.Write(buf[:min(int64(len(buf)), n)]); err != nil {
				return
			}
		}
		return
	}
	n, _ := io.CopyBuffer(discard, st, make([]byte, benchChunk))
	binary.Write(st, binary.BigEndian, n)
}

// discard hides io.Discard's ReadFrom, which reads in 8 KiB pieces: the
// proxy reads with its own (growing) buffer.
var discard = struct{ io.Writer }{io.Discard}

func sinkTCP(c *net.TCPConn) {
	n, _ := io.CopyBuffer(discard, c, make([]byte, benchChunk))
	binary.Write(c, binary.BigEndian, n)
}

// tunings are the implementation's switches, to measure what each buys.
var tunings = []struct {
	name                   string
	direct, batch, records bool
}{
	{"tuned", true, true, true},       // socket fast paths, our TLS record layer
	{"crypto-tls", true, true, false}, // crypto/tls's records, batched into few syscalls
	{"no-direct", false, true, true},  // plain Read/Write on sockets, every copy through a goroutine
	{"no-batch", true, false, false},  // crypto/tls, one write syscall per record
	{"neither", false, false, false},
}

// use sets the package switches for one benchmark and restores them.
func use(b *testing.B, direct, batch, records bool) {
	d0, b0, r0 := directIO, batchWrites, ownRecords
	directIO, batchWrites, ownRecords = direct, batch, records
	b.Cleanup(func() { directIO, batchWrites, ownRecords = d0, b0, r0 })
}

func BenchmarkThroughput(b *testing.B) {
	for _, tu := range tunings {
		b.Run("upload/"+tu.name, func(b *testing.B) {
			use(b, tu.direct, tu.batch, tu.records)
			e := newEnv(b, sinkHandler, envOpts{})
			s, err := e.pool.Connect(testCtx(b), e.key, "127.0.0.1:80", nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchUpload(b, s)
		})
		b.Run("download/"+tu.name, func(b *testing.B) {
			use(b, tu.direct, tu.batch, tu.records)
			e := newEnv(b, sinkHandler, envOpts{})
			total := int64(b.N) * benchChunk
			hdr := &ConnectHeader{Extra: http.Header{"X-Bench-Download": {strconv.FormatInt(total, 10)}}}
			b.SetBytes(benchChunk)
			b.ReportAllocs()
			b.ResetTimer()
			cost := startCost()
			s, err := e.pool.Connect(testCtx(b), e.key, "127.0.0.1:80", hdr)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			buf := make([]byte, benchChunk)
			n, err := io.CopyBuffer(discard, s, buf)
			if err != nil || n != total {
				b.Fatalf("downloaded %d of %d: %v", n, total, err)
			}
			cost.report(b, total)
		})
	}
}

func BenchmarkThroughputTCP(b *testing.B) {
	addr := startTCP(b, sinkTCP)
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	benchUpload(b, c.(*net.TCPConn))
}

type halfCloser interface {
	io.ReadWriter
	CloseWrite() error
}

func benchUpload(b *testing.B, c halfCloser) {
	buf := make([]byte, benchChunk)
	b.SetBytes(benchChunk)
	b.ReportAllocs()
	b.ResetTimer()
	cost := startCost()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.CloseWrite()
	var n int64
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cost.report(b, n)
	if n != int64(b.N)*benchChunk {
		b.Fatalf("sink got %d bytes, sent %d", n, int64(b.N)*benchChunk)
	}
}

func gcTwice() {
	runtime.GC()
	runtime.GC()
}

// BenchmarkIdleStream reports the memory and goroutines one open, idle
// stream costs on both ends (client pool and server in one process).
func BenchmarkIdleStream(b *testing.B) {
	const n = 500
	e := newEnv(b, func(ctx context.Context, req *Request) {
		st, err := req.Accept(nil)
		if err != nil {
			return
		}
		defer st.Close()
		io.Copy(io.Discard, st)
	}, envOpts{})
	ctx := testCtx(b)
	for range b.N {
		gcTwice() // also empties sync.Pools (victim cache included)
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		streams := make([]*Stream, 0, n)
		for range n {
			s, err := e.pool.Connect(ctx, e.key, "127.0.0.1:80", nil)
			if err != nil {
				b.Fatal(err)
			}
			streams = append(streams, s)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse+after.StackInuse-before.HeapInuse-before.StackInuse)/n, "B/stream")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/stream")
		for _, s := range streams {
			s.CloseWrite()
			io.Copy(io.Discard, s)
			s.Close()
		}
	}
}

// BenchmarkIdleConn reports what one idle pooled connection (no streams)
// costs on both ends: heap, stacks and goroutines.
func BenchmarkIdleConn(b *testing.B) {
	const n = 200
	e := newEnv(b, echoHandler, envOpts{})
	ctx := testCtx(b)
	for i := range b.N {
		gcTwice()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		for j := range n {
			k := e.key
			k.Dst = strconv.Itoa(i*n + j) // a distinct key per connection
			s, err := e.pool.Connect(ctx, k, "127.0.0.1:80", nil)
			if err != nil {
				b.Fatal(err)
			}
			s.CloseWrite()
			io.Copy(io.Discard, s)
			s.Close()
		}
		waitFor(b, "server handlers to finish", func() bool { return e.metric(b, "ztunnel_hbone_server_streams", "") == 0 })
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse+after.StackInuse-before.HeapInuse-before.StackInuse)/n, "B/conn")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/conn")
	}
}
