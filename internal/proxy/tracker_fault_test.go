package proxy

import (
	"context"
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
