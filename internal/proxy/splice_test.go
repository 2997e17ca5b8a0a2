package proxy

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// TestSpliceCopyBytesAndEOF: 8 MiB through spliceCopy arrive intact, the
// count matches, and EOF ends the copy.
func TestSpliceCopyBytesAndEOF(t *testing.T) {
	in, src := tcpPair(t)  // the test writes into in; spliceCopy reads src
	dst, out := tcpPair(t) // spliceCopy writes dst; the test reads out
	defer in.Close()
	defer out.Close()
	msg := make([]byte, 8<<20)
	rand.Read(msg)
	var n atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- spliceCopy(dst, src, &n)
		dst.CloseWrite()
	}()
	go func() {
		in.Write(msg)
		in.CloseWrite()
	}()
	got, err := io.ReadAll(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes, want %d identical", len(got), len(msg))
	}
	if err := <-done; err != nil {
		t.Fatalf("spliceCopy: %v", err)
	}
	if n.Load() != int64(len(msg)) {
		t.Errorf("counted %d, want %d", n.Load(), len(msg))
	}
}

// TestSpliceIdleHoldsNoPipe: copies that moved bytes and went idle hold no
// pipe descriptors (the runtime's splice keeps two per copy).
func TestSpliceIdleHoldsNoPipe(t *testing.T) {
	const conns = 20
	drainFreePipes()
	before := countFDs(t)
	for range conns {
		in, src := tcpPair(t)
		dst, out := tcpPair(t)
		var n atomic.Int64
		go spliceCopy(dst, src, &n)
		in.Write([]byte("ping"))
		b := make([]byte, 4)
		if _, err := io.ReadFull(out, b); err != nil || string(b) != "ping" {
			t.Fatalf("copy: %q %v", b, err)
		}
		t.Cleanup(func() { in.Close(); src.Close(); dst.Close(); out.Close() })
	}
	time.Sleep(50 * time.Millisecond)
	drainFreePipes()
	// Each connection is four sockets here (two pairs); pipes would add more.
	if got, want := countFDs(t)-before, 4*conns; got > want {
		t.Errorf("%d descriptors for %d idle copies, want at most %d (no pipes held)", got, conns, want)
	}
}

// drainFreePipes closes the pooled pipes so descriptor counts see only
// pipes in use.
func drainFreePipes() {
	for {
		select {
		case p := <-freePipes:
			p.close()
		default:
			return
		}
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(es)
}
