// Package workers runs short jobs — the set-up of one proxied connection —
// on goroutines that are kept between jobs, so each job starts on a stack
// already grown to what such set-up needs.
//
// A fresh goroutine starts with a 2 KiB stack, and the set-up of a
// connection (policy, a dial through the net package, a CONNECT) grows it
// several times, each growth a copy of the whole stack: in CPU profiles of
// the bench's connection loop, runtime.newstack was 6-8.5 % of the
// receiving ztunnel's time, nearly all under the HBONE stream's set-up
// goroutine, and 3-5 % of the sending one's. gRPC-go's server stream
// workers exist for the same reason.
//
// One Pool serves the whole process (every pod's proxy), so the goroutines
// kept are bounded per node, not per pod. A kept goroutine parks between
// jobs with its stack and ends after idleTimeout without one, so a node
// that stopped taking connections gives them back.
//
// Long-lived work (copying the bytes of a connection that may idle for
// hours) must not run here: it would hold a kept goroutine and its grown
// stack for the connection's life. Jobs hand such work to goroutines of
// their own (proxy's relay).
package workers

import (
	"context"
	"sync/atomic"
	"time"
)

// idleTimeout is how long a kept goroutine waits for a next job: far
// above the gap between connections of a busy node (sub-millisecond), and
// short enough that a burst's goroutines are gone seconds after it.
const idleTimeout = 5 * time.Second

// Pool runs jobs on at most max kept goroutines; beyond that (a burst)
// a job gets a goroutine of its own that ends with it. The zero Pool is
// not usable; see New.
type Pool struct {
	// immutable after New
	jobs chan func()
	done <-chan struct{}
	max  int32
	idle time.Duration

	kept atomic.Int32 // goroutines that wait for a next job after theirs
}

// New returns a Pool whose kept goroutines end when ctx is done (a job
// already running finishes first).
func New(ctx context.Context, max int) *Pool {
	return &Pool{jobs: make(chan func()), done: ctx.Done(), max: int32(max), idle: idleTimeout}
}

// Go runs f on a waiting kept goroutine if there is one, else on a new
// goroutine. It never blocks. A nil Pool runs every f on a new goroutine.
func (p *Pool) Go(f func()) {
	if p == nil {
		go f()
		return
	}
	select {
	case p.jobs <- f:
	default:
		go p.run(f)
	}
}

// run runs f, then further jobs while the pool keeps this goroutine.
func (p *Pool) run(f func()) {
	f()
	if p.kept.Add(1) > p.max {
		p.kept.Add(-1)
		return
	}
	defer p.kept.Add(-1)
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		var got bool
		select {
		case f = <-p.jobs:
			got = true
		case <-t.C:
		case <-p.done:
		}
		if !got {
			return
		}
		f()
		t.Reset(p.idle)
	}
}
