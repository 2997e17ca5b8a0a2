package main

import (
	"os"
	"slices"
	"testing"
	"time"
)

func TestParseGCTrace(t *testing.T) {
	log := []byte(`time=2026-12-07T12:00:00.000Z level=INFO msg="ztunnel started"
gc 1 @0.130s 0%: 0.52+2.9+0.023 ms clock, 1.0+0/1.2/0.55+0.046 ms cpu, 3->3->2 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P
gc 2 @12.500s 0%: 0.028+1.1+0.002 ms clock, 0.028+1.1/0/0+0.002 ms cpu, 4->4->2 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 1 P (forced)
gc 3 @x.1s 0%: 0.1+0.1+0.1 ms clock, junk
gc 4 @13s 0%: 0.1+y+0.1 ms clock, junk
gcfoo bar
time=2026-12-07T12:00:01.000Z level=WARN msg="gc 9 @1.0s 0%: 1+1+1 ms clock,"
`)
	got := parseGCTrace(log)
	want := []gcCycle{
		{at: 130 * time.Millisecond, dur: 3443 * time.Microsecond},
		{at: 12500 * time.Millisecond, dur: 1130 * time.Microsecond},
	}
	if len(got) != len(want) {
		t.Fatalf("parseGCTrace: %d cycles %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if d := got[i].at - want[i].at; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("cycle %d at %v, want %v", i, got[i].at, want[i].at)
		}
		if d := got[i].dur - want[i].dur; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("cycle %d ran %v, want %v", i, got[i].dur, want[i].dur)
		}
	}
}

func TestWithGCTrace(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{nil, []string{"GODEBUG=gctrace=1"}},
		{[]string{"A=1"}, []string{"A=1", "GODEBUG=gctrace=1"}},
		{[]string{"GODEBUG=madvdontneed=1", "A=1"}, []string{"GODEBUG=madvdontneed=1,gctrace=1", "A=1"}},
		{[]string{"GODEBUG=x=1", "GODEBUG=gctrace=2"}, []string{"GODEBUG=x=1", "GODEBUG=gctrace=2"}},
		{[]string{"GODEBUG="}, []string{"GODEBUG=gctrace=1"}},
	} {
		if got := withGCTrace(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("withGCTrace(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestProcessStart(t *testing.T) {
	start, err := processStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// This test process began before now, and not long before: a test
	// binary that has run for an hour is not one this test runs in.
	if age := time.Since(start); age < 0 || age > time.Hour {
		t.Fatalf("processStart: the test process began %v ago", age)
	}
	if _, err := parseStartTicks("1 (a) b"); err == nil {
		t.Fatal("parseStartTicks accepted a short stat line")
	}
}

func TestGCOverlap(t *testing.T) {
	// 100 requests due every ms from t0; request i takes 100 µs, but 30..32
	// and 70 take 5 ms. One cycle runs from 29.5 ms for 1 ms, so requests
	// 29 to 30 plus what gcSlack adds overlap it; 70 is slow away from it.
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	lat := openLoopResult{start: t0, slots: slots{interval: time.Millisecond}}
	for i := range 100 {
		d := 100 * time.Microsecond
		if (i >= 30 && i <= 32) || i == 70 {
			d = 5 * time.Millisecond
		}
		lat.each = append(lat.each, d)
	}
	cycle := gcCycle{at: 29500 * time.Microsecond, dur: time.Millisecond}
	ws := windows(t0, []gcCycle{cycle})
	rep := gcOverlap(lat, ws, 5*time.Millisecond)
	if rep.Slow != 4 || rep.SlowNearGC != 3 {
		t.Errorf("slow %d, near a cycle %d; want 4 and 3", rep.Slow, rep.SlowNearGC)
	}
	// Window: 29.5 ms to 30.5 ms + gcSlack (12 ms) = 42.5 ms: requests due
	// at 29 ms (ends 29.1: before it) are out, 30..42 are in.
	if rep.NearGC != 13 {
		t.Errorf("%d requests near the cycle, want 13", rep.NearGC)
	}
	// Away from it, one slow request of 87: its p99 is that 5 ms.
	if rep.P99AwayFromGC != 5000 {
		t.Errorf("p99 away from GC %v µs, want 5000", rep.P99AwayFromGC)
	}
	// No cycles: nothing is near, and the p99 is the phase's.
	if rep := gcOverlap(lat, nil, 5*time.Millisecond); rep.NearGC != 0 || rep.SlowNearGC != 0 || rep.Slow != 4 {
		t.Errorf("no cycles: %+v", rep)
	}
}
