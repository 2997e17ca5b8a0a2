package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/config"
)

// writeLog records each Write its logWriter makes, with the time.
type writeLog struct {
	mu     sync.Mutex
	writes []string
	at     []time.Time
}

func (l *writeLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = append(l.writes, string(p))
	l.at = append(l.at, time.Now())
	return len(p), nil
}

func (l *writeLog) snapshot() ([]string, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.writes...), append([]time.Time(nil), l.at...)
}

func TestLogWriterBatchesLinesUntilTheDelay(t *testing.T) {
	var out writeLog
	w := newLogWriter(&out)
	log := slog.New(slog.NewTextHandler(w, nil))
	start := time.Now()
	const lines = 200
	for i := range lines {
		log.Info("connection complete", "n", i)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		writes, _ := out.snapshot()
		if strings.Count(strings.Join(writes, ""), "\n") == lines {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s %d writes hold %d of %d lines", len(writes), strings.Count(strings.Join(writes, ""), "\n"), lines)
		}
		time.Sleep(10 * time.Millisecond)
	}
	writes, at := out.snapshot()
	if len(writes) >= lines/10 {
		t.Errorf("%d lines took %d writes; want them batched", lines, len(writes))
	}
	if d := at[0].Sub(start); d < logFlushDelay {
		t.Errorf("first write %v after the first line; want it held for %v", d, logFlushDelay)
	}
	got := strings.Join(writes, "")
	for i := range lines {
		if !strings.Contains(got, fmt.Sprintf(" n=%d\n", i)) {
			t.Fatalf("line %d missing or split:\n%s", i, got)
		}
	}
}

func TestLogWriterWritesAFullBatchAtOnce(t *testing.T) {
	var out writeLog
	w := newLogWriter(&out)
	line := bytes.Repeat([]byte("x"), 1023)
	line = append(line, '\n')
	for range logFlushBytes / len(line) {
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	// The batch reached logFlushBytes on the last Write, which wrote it
	// before returning: no timer involved.
	writes, _ := out.snapshot()
	if len(writes) != 1 || len(writes[0]) != logFlushBytes {
		t.Fatalf("got %d writes after %d bytes; want one of %d", len(writes), logFlushBytes, logFlushBytes)
	}
	w.Write([]byte("tail\n"))
	w.Flush()
	writes, _ = out.snapshot()
	if len(writes) != 2 || writes[1] != "tail\n" {
		t.Fatalf("Flush wrote %q; want the held line at once", writes[1:])
	}
	w.Flush()
	if writes, _ = out.snapshot(); len(writes) != 2 {
		t.Fatalf("an empty Flush wrote %q", writes[2:])
	}
}

// Lines from many goroutines all arrive whole, in each goroutine's order.
func TestLogWriterConcurrentWritersKeepLinesWhole(t *testing.T) {
	var out writeLog
	w := newLogWriter(&out)
	log := slog.New(slog.NewTextHandler(w, nil))
	const writers, each = 8, 2000
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				log.Info("line", "g", g, "i", i, "pad", strings.Repeat("p", i%300))
			}
		})
	}
	wg.Wait()
	w.Flush()
	writes, _ := out.snapshot()
	next := make([]int, writers)
	for _, l := range strings.Split(strings.TrimSuffix(strings.Join(writes, ""), "\n"), "\n") {
		var g, i int
		j := strings.Index(l, " g=")
		if j < 0 {
			t.Fatalf("line without g=: %q", l)
		}
		if _, err := fmt.Sscanf(l[j:], " g=%d i=%d", &g, &i); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if i != next[g] {
			t.Fatalf("writer %d: line %d arrived where %d was due", g, i, next[g])
		}
		next[g]++
	}
	for g, n := range next {
		if n != each {
			t.Errorf("writer %d: %d of %d lines arrived", g, n, each)
		}
	}
	if len(writes) > writers*each/10 {
		t.Errorf("%d lines took %d writes", writers*each, len(writes))
	}
}

// A warning writes itself and the lines batched before it at once, through
// the scoped loggers run hands out.
func TestLogWriterWarningFlushesTheBatch(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var out writeLog
			w := newLogWriter(&out)
			levels, err := newLevels(&config.Config{LogLevel: "info", LogFormat: format}, w)
			if err != nil {
				t.Fatal(err)
			}
			log := levels.Logger("proxy").With("conn", 7)
			log.Info("connection complete")
			log.Debug("hidden")
			if writes, _ := out.snapshot(); len(writes) != 0 {
				t.Fatalf("an INFO line was written at once: %q", writes)
			}
			log.Warn("connection failed")
			writes, _ := out.snapshot()
			if len(writes) != 1 {
				t.Fatalf("after the warning: %d writes %q; want one holding both lines", len(writes), writes)
			}
			got := writes[0]
			if i, j := strings.Index(got, "connection complete"), strings.Index(got, "connection failed"); i < 0 || j < i {
				t.Fatalf("want the INFO line, then the warning:\n%s", got)
			}
			attr := map[string]string{"text": "conn=7", "json": `"conn":7`}[format]
			if strings.Contains(got, "hidden") || !strings.Contains(got, "proxy") || strings.Count(got, attr) != 2 {
				t.Fatalf("scope or attrs lost through the wrapper:\n%s", got)
			}
		})
	}
}
