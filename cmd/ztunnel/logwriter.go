package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logFlushDelay is how long a log line may wait for company before it is
// written. Every proxied connection ends with an access log line; written
// one by one that is a write(2) per connection here and, under a container
// runtime, a pipe wake-up and a read in the runtime's log shim too. Batched,
// a busy node writes once per delay or per logFlushBytes, and a line still
// reaches `kubectl logs` well within a second. Upstream hands lines to a
// writer thread for the same reason.
const logFlushDelay = 100 * time.Millisecond

// logFlushBytes bounds the batch: past it the line that crossed writes the
// batch at once, so a burst of logging costs memory only up to this much.
const logFlushBytes = 64 << 10

// logWriter batches log lines for out; flushOnWarn writes the batch out
// with any warning or error, so the lines leading up to a problem are out
// when the problem is, even if the process dies right after. Each Write
// must hold whole lines (slog's handlers write one record per call), so a
// flush never splits a line. A write error drops the batch: there is
// nowhere left to report it.
type logWriter struct {
	out io.Writer

	mu    sync.Mutex
	buf   []byte
	timer *time.Timer // armed while buf holds lines
}

func newLogWriter(out io.Writer) *logWriter {
	w := &logWriter{out: out}
	w.timer = time.AfterFunc(time.Hour, w.Flush)
	w.timer.Stop()
	return w
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		w.timer.Reset(logFlushDelay)
	}
	w.buf = append(w.buf, p...)
	if len(w.buf) >= logFlushBytes {
		w.flushLocked()
	}
	return len(p), nil
}

// Flush writes what is batched now. It runs on the timer and must run
// before the process exits.
func (w *logWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
}

func (w *logWriter) flushLocked() {
	w.timer.Stop()
	if len(w.buf) == 0 {
		return
	}
	_, _ = w.out.Write(w.buf)
	// A burst may have grown the buffer far past a normal batch; let it go
	// rather than keep the peak for the life of the process.
	if cap(w.buf) > 2*logFlushBytes {
		w.buf = nil
	} else {
		w.buf = w.buf[:0]
	}
}

type flusher interface{ Flush() }

// flushOnWarn passes records to a handler writing into a batching writer
// and flushes the batch after each record at WARN or above.
type flushOnWarn struct {
	slog.Handler
	w flusher
}

func (h flushOnWarn) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.w.Flush()
	}
	return err
}

func (h flushOnWarn) WithAttrs(as []slog.Attr) slog.Handler {
	return flushOnWarn{h.Handler.WithAttrs(as), h.w}
}

func (h flushOnWarn) WithGroup(name string) slog.Handler {
	return flushOnWarn{h.Handler.WithGroup(name), h.w}
}
