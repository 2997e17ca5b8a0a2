package main

import (
	"context"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// certReadiness marks the "certificates" readiness condition once every
// identity served at start-up has a certificate. In shared mode the set is
// the pods of the first ZDS snapshot; pods added later do not affect
// readiness (as a restart must not wait on a new pod's CA round trip).
type certReadiness struct {
	certs *identity.Manager
	done  func()

	mu       sync.Mutex
	pending  int  // fetches in flight for start-up identities
	complete bool // the start-up set is known (snapshot received)
	marked   bool
}

func newCertReadiness(certs *identity.Manager, done func()) *certReadiness {
	return &certReadiness{certs: certs, done: done}
}

// track fetches id's certificate (retrying until ctx ends) and counts it
// against readiness if the start-up set is still open.
func (r *certReadiness) track(ctx context.Context, id identity.Identity) {
	r.mu.Lock()
	if r.complete {
		r.mu.Unlock()
		return
	}
	r.pending++
	r.mu.Unlock()
	go func() {
		for ctx.Err() == nil {
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := r.certs.Get(fctx, id)
			cancel()
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		r.mu.Lock()
		r.pending--
		r.checkLocked()
		r.mu.Unlock()
	}()
}

// closeSet says the start-up set is complete.
func (r *certReadiness) closeSet() {
	r.mu.Lock()
	r.complete = true
	r.checkLocked()
	r.mu.Unlock()
}

func (r *certReadiness) checkLocked() {
	if r.complete && r.pending == 0 && !r.marked {
		r.marked = true
		r.done()
	}
}
