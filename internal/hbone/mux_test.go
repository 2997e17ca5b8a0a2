package hbone

import (
	"bytes"
	"io"
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
