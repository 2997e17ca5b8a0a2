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
	"testing"
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

// reportSyscalls reports syscalls per MiB since (r0, w0) for total bytes.
func reportSyscalls(b *testing.B, r0, w0 float64, total int64) {
	r1, w1 := syscalls()
	mib := float64(total) / (1 << 20)
	if mib > 0 && r1 > 0 {
		b.ReportMetric((r1-r0)/mib, "reads/MiB")
		b.ReportMetric((w1-w0)/mib, "writes/MiB")
	}
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
// proxy reads with its own (growing) buffer, and x/net sends a
// WINDOW_UPDATE per ≥ 4 KiB consumed, so read size drives its rate.
var discard = struct{ io.Writer }{io.Discard}

func sinkTCP(c *net.TCPConn) {
	n, _ := io.CopyBuffer(discard, c, make([]byte, benchChunk))
	binary.Write(c, binary.BigEndian, n)
}

var tunings = []struct {
	name string
	t    *h2Tuning
}{
	{"tuned", nil},                 // 4 MiB stream, 16 MiB conn, 1 MiB frames
	{"xnet-defaults", &h2Tuning{}}, // x/net's own defaults on both sides
	{"16KiB-frames", &h2Tuning{streamWindow: streamWindow, connWindow: connWindow, maxFrameSize: 16 << 10}},
	{"no-batch", &h2Tuning{streamWindow: streamWindow, connWindow: connWindow, maxFrameSize: maxFrameSize, noBatch: true}},
	{"xnet-defaults-no-batch", &h2Tuning{noBatch: true}},
}

func BenchmarkThroughput(b *testing.B) {
	for _, tu := range tunings {
		b.Run("upload/"+tu.name, func(b *testing.B) {
			e := newEnv(b, sinkHandler, envOpts{
				pool:   func(o *PoolOptions) { o.tuning = tu.t },
				server: func(o *ServerOptions) { o.tuning = tu.t },
			})
			s, err := e.pool.Connect(testCtx(b), e.key, "127.0.0.1:80", nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchUpload(b, s)
		})
		b.Run("download/"+tu.name, func(b *testing.B) {
			e := newEnv(b, sinkHandler, envOpts{
				pool:   func(o *PoolOptions) { o.tuning = tu.t },
				server: func(o *ServerOptions) { o.tuning = tu.t },
			})
			total := int64(b.N) * benchChunk
			hdr := http.Header{"X-Bench-Download": {strconv.FormatInt(total, 10)}}
			b.SetBytes(benchChunk)
			b.ReportAllocs()
			b.ResetTimer()
			r0, w0 := syscalls()
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
			reportSyscalls(b, r0, w0, total)
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
	r0, w0 := syscalls()
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
	reportSyscalls(b, r0, w0, n)
	if n != int64(b.N)*benchChunk {
		b.Fatalf("sink got %d bytes, sent %d", n, int64(b.N)*benchChunk)
	}
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
		runtime.GC()
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
