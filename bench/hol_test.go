package main

import (
	"net"
	"testing"
	"time"
)

func TestSplitByTurn(t *testing.T) {
	// 1000 requests 1 ms apart; the writer pauses at 300 ms, the stream is
	// idle from 400 ms, moves again from 600 ms and pauses at 900 ms.
	// Requests beside the moving stream take 2 ms, except one 50 ms stall
	// in the first turn; the others take 1 ms.
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	turns := []turn{{at(300), bulkDraining}, {at(400), bulkIdle}, {at(600), bulkMoving}, {at(900), bulkDraining}}
	each := make([]time.Duration, 1000)
	for i := range each {
		each[i] = time.Millisecond
		if i < 300 || (i >= 600 && i < 900) {
			each[i] = 2 * time.Millisecond
		}
	}
	for i := 100; i < 150; i++ {
		each[i] = 50 * time.Millisecond
	}
	ts := splitByTurn(openLoopResult{each: each, start: start, slots: slots{interval: time.Millisecond}}, turns, 20*time.Millisecond)
	// Moving: 0-299 (no turn before it, so nothing settles) and 620-899;
	// idle: 400-599; draining (300-399, 900-999): neither.
	if ts.loaded.Count != 300+280 || ts.idle.Count != 200 {
		t.Fatalf("loaded %d, idle %d requests; want 580 and 200", ts.loaded.Count, ts.idle.Count)
	}
	// The stall is 50 of the first turn's 300 requests: it sets that
	// turn's p99 and the whole loaded set's, not the median turn's.
	if ts.loaded.P99 != 50000 {
		t.Errorf("loaded p99 %v µs, want the stall's 50000", ts.loaded.P99)
	}
	if ts.loadedTurnP99 != (50000+2000)/2 {
		t.Errorf("loaded turns' median p99 %v µs, want the mean of 50000 and 2000 (two turns)", ts.loadedTurnP99)
	}
	if ts.idleTurnP99 != 1000 || ts.idle.P99 != 1000 {
		t.Errorf("idle p99 %v, turns' median %v µs; want 1000", ts.idle.P99, ts.idleTurnP99)
	}
}

// TestValve runs a bulk stream to a slow sink over loopback while
// alternate pauses its writer: it must see the stream drain (everything
// written was read) and go idle, and the sink must still check every byte.
func TestValve(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	v := newValve()
	sinkErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			sinkErr <- err
			return
		}
		defer c.Close()
		sinkErr <- sink(c, 16<<10, slowReaderRate, v)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := make(chan struct{})
	sent := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = (&path{}).stream(c, func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}, time.Now().Add(30*time.Second), v)
		sent <- err
	}()
	turnsCh := make(chan []turn, 1)
	go func() { turnsCh <- alternate(v, stop, 200*time.Millisecond) }()
	time.Sleep(2 * time.Second)
	close(stop)
	turns := <-turnsCh
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := <-sinkErr; err != nil {
		t.Fatal(err)
	}
	var states []bulkState
	for _, tn := range turns {
		states = append(states, tn.state)
	}
	if len(states) < 3 || states[0] != bulkDraining || states[1] != bulkIdle || states[2] != bulkMoving {
		t.Fatalf("states %v, want draining, idle, moving, …", states)
	}
	// The writer stopped at the end: everything it wrote was read.
	if got := v.read.Load(); got != n || got != v.written.Load() || n <= 0 {
		t.Fatalf("sink read %d, writer wrote %d (counted %d)", got, n, v.written.Load())
	}
}

func TestValveDrained(t *testing.T) {
	v := newValve()
	v.written.Store(100)
	v.read.Store(50)
	v.parked.Store(true)
	if v.drained() {
		t.Fatal("drained with 50 bytes in flight")
	}
	v.read.Store(100)
	v.parked.Store(false)
	if v.drained() {
		t.Fatal("drained while the writer writes")
	}
	v.parked.Store(true)
	if !v.drained() {
		t.Fatal("not drained: writer parked, everything read")
	}
}
