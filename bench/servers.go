package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// Server ports inside every server pod. Neither is a ztunnel port
// (15001/15006/15008/150xx), so redirected traffic reaches them only
// through ztunnel's inbound.
const (
	echoPort = 7001 // echoes every byte until EOF
	sinkPort = 7002 // checks a pattern stream until EOF, then answers a summary
	// slowSinkPort is sinkPort's reader held to slowReaderRate: a bulk
	// stream to it keeps every buffer and flow-control window on its path
	// full while it costs little CPU, the case where a shared HBONE
	// connection could stall its other streams (head-of-line blocking).
	slowSinkPort = 7003
)

// slowReaderRate is how many bytes per second the slow sink reads: ~1/20
// of what one stream through two ztunnels moves on the 2-vCPU VM, so the
// bulk sender is held by flow control, not by the CPU.
const slowReaderRate = 16 << 20

// sinkSummaryLen: the sink's answer, two little-endian int64s: bytes
// received and the offset of the first wrong byte (-1 if none).
const sinkSummaryLen = 16

// echoBuf is the echo server's per-connection buffer: the largest message
// the harness echoes is 1 KiB, and idle connections are many.
const echoBuf = 2 << 10

// podServers are the echo and sink servers of one pod.
type podServers struct {
	pod  *nstest.Pod
	slow *valve // counts what the slow sink reads (head-of-line phase)
	lns  []net.Listener
	wg   sync.WaitGroup
	errs atomic.Int64 // server-side failures (read errors other than EOF, corrupted streams)

	mu       sync.Mutex
	conns    map[net.Conn]struct{} // guarded by mu
	firstErr error                 // guarded by mu
}

// startServers listens on echoPort, sinkPort and slowSinkPort at the pod's
// address.
func startServers(p *nstest.Pod) (*podServers, error) {
	s := &podServers{pod: p, slow: newValve(), conns: map[net.Conn]struct{}{}}
	slow := func(c net.Conn) error { return sink(c, 16<<10, slowReaderRate, s.slow) }
	for _, h := range []struct {
		port  int
		serve func(net.Conn) error
	}{{echoPort, serveEcho}, {sinkPort, serveSink}, {slowSinkPort, slow}} {
		ln, err := p.Listen("tcp", netip.AddrPortFrom(p.IP, uint16(h.port)).String())
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("bench: listen in %s: %w", p.Name, err)
		}
		s.lns = append(s.lns, ln)
		s.wg.Go(func() { s.accept(ln, h.serve) })
	}
	return s, nil
}

func (s *podServers) accept(ln net.Listener, serve func(net.Conn) error) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.fail(fmt.Errorf("accept: %w", err))
			}
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			err := serve(c)
			s.mu.Lock()
			_, tracked := s.conns[c]
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
			if err != nil && tracked {
				s.fail(err)
			}
		})
	}
}

func (s *podServers) fail(err error) {
	s.errs.Add(1)
	s.mu.Lock()
	if s.firstErr == nil {
		s.firstErr = fmt.Errorf("server in %s: %w", s.pod.Name, err)
	}
	s.mu.Unlock()
}

// failures returns how many server-side failures happened and the first.
func (s *podServers) failures() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs.Load(), s.firstErr
}

// stop closes the listeners and every open connection and waits for the
// handlers.
func (s *podServers) stop() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
		delete(s.conns, c) // closed by us: its handler's error is not a failure
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func serveEcho(c net.Conn) error {
	buf := make([]byte, echoBuf)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return fmt.Errorf("echo write: %w", werr)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("echo read: %w", err)
		}
	}
}

func serveSink(c net.Conn) error { return sink(c, maxChunk, 0, nil) }

// sink checks the pattern stream on c until EOF, reading chunk bytes at a
// time and, when rate > 0, no faster than rate bytes per second (the slow
// sink: 16 KiB reads, so the sender sees a receiver that is always
// behind); a non-nil v counts what it read. It then answers the summary.
func sink(c net.Conn, chunk int, rate float64, v *valve) error {
	buf := make([]byte, chunk)
	chk := newChecker()
	// The rate is kept from start on, counting bytes from base: a read
	// that came late is caught up, but not time spent waiting for data (a
	// paused writer), which would make a burst.
	start, base := time.Now(), int64(0)
	for {
		if rate > 0 {
			due := start.Add(time.Duration(float64(chk.off-base) / rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
		}
		t0 := time.Now()
		n, err := c.Read(buf)
		if rate > 0 && time.Since(t0) > 5*time.Millisecond {
			start, base = time.Now(), chk.off+int64(n)
		}
		chk.check(buf[:n])
		if v != nil {
			v.read.Add(int64(n))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("sink read after %d bytes: %w", chk.off, err)
		}
	}
	var sum [sinkSummaryLen]byte
	binary.LittleEndian.PutUint64(sum[:8], uint64(chk.off))
	binary.LittleEndian.PutUint64(sum[8:], uint64(chk.bad))
	if _, err := c.Write(sum[:]); err != nil {
		return fmt.Errorf("sink summary: %w", err)
	}
	return chk.err()
}

// valve pauses the head-of-line phase's bulk writer and tells when what
// it wrote has all been read: closed and drained, the stream is open but
// idle, so requests then are the unloaded reference measured in the same
// seconds as the requests beside the moving stream.
type valve struct {
	mu sync.Mutex
	ch chan struct{} // guarded by mu; closed while the valve is open

	written, read atomic.Int64
	parked        atomic.Bool // the writer waits in wait: written is final
}

func newValve() *valve {
	ch := make(chan struct{})
	close(ch)
	return &valve{ch: ch}
}

func (v *valve) set(open bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.ch:
		if !open {
			v.ch = make(chan struct{})
		}
	default:
		if open {
			close(v.ch)
		}
	}
}

// wait returns once the valve is open; a nil valve always is.
func (v *valve) wait() {
	if v == nil {
		return
	}
	v.mu.Lock()
	ch := v.ch
	v.mu.Unlock()
	select {
	case <-ch:
	default:
		v.parked.Store(true)
		<-ch
		v.parked.Store(false)
	}
}

// drained reports whether the writer is paused and every byte it wrote has
// been read.
func (v *valve) drained() bool {
	return v.parked.Load() && v.read.Load() >= v.written.Load()
}
