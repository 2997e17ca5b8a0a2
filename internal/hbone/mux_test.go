package hbone

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
)

// TestManyStreamsShareOneConnection: bulk transfers and many short
// request/response streams at once, on one key, stay on one connection
// with no HTTP/2 error on either side, and every byte comes back.
func TestManyStreamsShareOneConnection(t *testing.T) {
	e := newEnv(t, echoHandler, envOpts{})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	// Two bulk echoes of 8 MiB.
	for range 2 {
		wg.Go(func() {
			s, err := e.pool.Connect(ctx, e.key, "127.0.0.1:80", nil)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			msg := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16)
			go func() { s.Write(msg); s.CloseWrite() }()
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, msg) {
				errs <- err
				t.Errorf("bulk echo: %d of %d bytes, %v", len(got), len(msg), err)
			}
		})
	}
	// 16 workers, each 50 short streams.
	for w := range 16 {
		wg.Go(func() {
			for i := range 50 {
				s, err := e.pool.Connect(ctx, e.key, "127.0.0.1:80", nil)
				if err != nil {
					errs <- err
					return
				}
				msg := []byte{byte(w), byte(i), 1, 2, 3}
				s.Write(msg)
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
					t.Errorf("short echo: %v %v", got, err)
				}
				s.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("connect: %v", err)
	}
	if n := e.ln.accepted.Load(); n != 1 {
		t.Errorf("%d connections accepted, want 1", n)
	}
	for _, m := range []string{"ztunnel_hbone_pool_http2_errors_total", "ztunnel_hbone_server_http2_errors_total"} {
		if got := e.metricSum(t, m); got != 0 {
			t.Errorf("%s = %v, want 0", m, got)
		}
	}
}

// metricSum adds up every series of a counter.
func (e *testEnv) metricSum(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestConcurrentUploadsLeaveNoGarbage: bulk streams writing at once on one
// connection take turns at the socket instead of copying their frames
// behind each other's writes. Copying made garbage of about half of what
// they sent (the write buffer grew past what its pool keeps on every
// turn); the bound here is an eighth, far above what a turn-taking writer
// allocates (pool refills after a GC, the streams' own set-up).
func TestConcurrentUploadsLeaveNoGarbage(t *testing.T) {
	e := newEnv(t, sinkHandler, envOpts{})
	ctx := testCtx(t)
	const streams, perStream = 4, 64 << 20
	ss := make([]*Stream, streams)
	for i := range ss {
		s, err := e.pool.Connect(ctx, e.key, "127.0.0.1:80", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ss[i] = s
	}
	if n := e.metric(t, "ztunnel_hbone_pool_connections", ""); n != 1 {
		t.Fatalf("%v pooled connections, want the streams on one", n)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for _, s := range ss {
		wg.Go(func() {
			buf := make([]byte, benchChunk)
			for sent := 0; sent < perStream; sent += len(buf) {
				if _, err := s.Write(buf); err != nil {
					errs <- err
					return
				}
			}
			s.CloseWrite()
			var n int64
			if err := binary.Read(s, binary.BigEndian, &n); err != nil || n != perStream {
				errs <- fmt.Errorf("sink got %d of %d bytes: %v", n, perStream, err)
			}
		})
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d streams × %d MiB: %d KiB allocated, %d GCs", streams, perStream>>20, alloc>>10, after.NumGC-before.NumGC)
	if raceEnabled {
		return // the transfer is checked; its allocations mean nothing here
	}
	if limit := uint64(streams * perStream / 8); alloc > limit {
		t.Errorf("allocated %d KiB while sending %d MiB on %d streams, want at most %d KiB", alloc>>10, streams*perStream>>20, streams, limit>>10)
	}
}
