package proxy

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFaultTrackerLateConnections: a connection still being set up when a
// drain starts is waited for, has its set-up aborted at the deadline, and
// is closed at once if it is tracked after the drain gave up — before, it
// ran on untracked after its pod was deleted (seen with 1,000 connections
// in TestFaultPodRemovedMidStream).
func TestFaultTrackerLateConnections(t *testing.T) {
	cases := []struct {
		name     string
		deadline time.Duration // drain ctx; 0: already done (pod deleted)
	}{
		{"pod deleted: ctx already done", 0},
		{"graceful drain runs out", 50 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker()
			end := tr.begin() // a handler mid set-up
			var aborted, closed atomic.Bool
			setupDone := make(chan struct{})
			go func() {
				defer end()
				<-setupDone
				untrack := tr.add(&tracked{close: func() { closed.Store(true) }})
				untrack()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			drained := make(chan struct{})
			go func() {
				tr.drain(ctx, func() { aborted.Store(true); close(setupDone) })
				close(drained)
			}()
			select {
			case <-drained:
			case <-time.After(5 * time.Second):
				t.Fatal("drain did not return after aborting the set-up")
			}
			if !aborted.Load() || !closed.Load() {
				t.Errorf("set-up aborted = %v, late connection closed = %v; want both", aborted.Load(), closed.Load())
			}
		})
	}
}

// TestFaultTrackerBeginDuringDrain: HBONE streams keep arriving while a
// shutdown drains (the server's GOAWAY is still on its way). Each one is
// counted and waited for like the connections before it. Before, the
// count was a sync.WaitGroup, and a stream beginning at a count of zero
// while the drain waited was a WaitGroup misuse that -race reported (once
// in ~160 runs of the proxy tests; this loop makes it near certain).
func TestFaultTrackerBeginDuringDrain(t *testing.T) {
	t.Run("streams begin and end around a drain", func(t *testing.T) {
		for range 50 {
			tr := newTracker()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						end := tr.begin()
						runtime.Gosched()
						end()
					}
				}()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
			tr.drain(ctx, func() {})
			cancel()
			close(stop)
			wg.Wait()
			tr.mu.Lock()
			active := tr.active
			tr.mu.Unlock()
			if active != 0 {
				t.Fatalf("%d connections still counted after every one ended", active)
			}
		}
	})

	t.Run("a stream that begins during the drain is waited for", func(t *testing.T) {
		tr := newTracker()
		endFirst := tr.begin()
		drained := make(chan struct{})
		var aborted atomic.Bool
		go func() {
			tr.drain(context.Background(), func() { aborted.Store(true) })
			close(drained)
		}()
		// Wait until the drain is blocked on the first connection.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			tr.mu.Lock()
			waiting := tr.idle != nil
			tr.mu.Unlock()
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("drain never started waiting")
			}
		}
		endLate := tr.begin()
		var closed atomic.Bool
		untrack := tr.add(&tracked{close: func() { closed.Store(true) }})
		endFirst()
		select {
		case <-drained:
			t.Fatal("drain returned while a stream that began during it was still open")
		case <-time.After(50 * time.Millisecond):
		}
		if closed.Load() || aborted.Load() {
			t.Fatalf("graceful drain with no deadline: closed a live stream = %v, aborted set-ups = %v; want neither while it is open", closed.Load(), aborted.Load())
		}
		untrack()
		endLate()
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
			t.Fatal("drain did not return after the last stream ended")
		}
	})
}
