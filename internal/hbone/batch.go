package hbone

import (
	"crypto/tls"
	"net"
	"sync"
)

// crypto/tls writes each record (at most 16 KiB of payload) with its own
// write syscall, so one 256 KiB DATA frame costs 16 syscalls while plain
// TCP needs one. batchConn sits under the tls.Conn and, only for the
// duration of a large tls.Conn.Write, gathers the records into one buffer
// written with few syscalls. Small writes (interactive traffic) and writes
// crypto/tls makes on its own (alerts, key updates) pass straight through,
// so nothing waits in the buffer.
const (
	// batchMinWrite: a Write of one record or less has nothing to gather;
	// above it, every extra record saves a syscall for a 16 KiB copy.
	batchMinWrite = 16<<10 + 1
	// batchBufSize holds one maximum-size DATA frame (frame header plus
	// payload, split into records with their overhead), so a frame goes out
	// in one syscall; a larger write is flushed each time the buffer fills.
	batchBufSize = ((maxFrameSize+9)/(16<<10) + 1) * (16<<10 + 64)
)

// batchBufs holds gather buffers between writes, so an idle connection
// owns none.
var batchBufs = sync.Pool{New: func() any { b := make([]byte, 0, batchBufSize); return &b }}

// batchConn is the raw connection under a tls.Conn.
type batchConn struct {
	net.Conn

	mu    sync.Mutex
	depth int     // guarded by mu: batching Writes in progress
	buf   *[]byte // guarded by mu: non-nil while depth > 0

	// While bounded, Read stops at the end of each record, so that when
	// the handshake is done crypto/tls holds no bytes of the records
	// after it: those are the record layer's. Only crypto/tls reads.
	bounded bool
	hdr     [recordHeaderLen]byte
	hdrN    int // header bytes of the current record read
	body    int // body bytes of the current record still to read
}

func (c *batchConn) Read(p []byte) (int, error) {
	if !c.bounded {
		return c.Conn.Read(p)
	}
	if c.hdrN < recordHeaderLen {
		n, err := c.Conn.Read(p[:min(len(p), recordHeaderLen-c.hdrN)])
		copy(c.hdr[c.hdrN:], p[:n])
		if c.hdrN += n; c.hdrN == recordHeaderLen {
			c.body = int(c.hdr[3])<<8 | int(c.hdr[4])
		}
		return n, err
	}
	n, err := c.Conn.Read(p[:min(len(p), c.body)])
	if c.body -= n; c.body == 0 {
		c.hdrN = 0
	}
	return n, err
}

// atRecordEnd reports whether the bounded reads stopped between records.
func (c *batchConn) atRecordEnd() bool { return c.hdrN == 0 && c.body == 0 }

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth == 0 {
		return c.Conn.Write(p)
	}
	b := *c.buf
	if len(b)+len(p) > cap(b) {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		b = *c.buf
		if len(p) > cap(b) {
			return c.Conn.Write(p)
		}
	}
	*c.buf = append(b, p...)
	return len(p), nil
}

func (c *batchConn) begin() {
	c.mu.Lock()
	if c.depth == 0 {
		c.buf = batchBufs.Get().(*[]byte)
	}
	c.depth++
	c.mu.Unlock()
}

func (c *batchConn) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.flushLocked()
	c.depth--
	if c.depth == 0 {
		*c.buf = (*c.buf)[:0]
		batchBufs.Put(c.buf)
		c.buf = nil
	}
	return err
}

func (c *batchConn) flushLocked() error {
	b := *c.buf
	if len(b) == 0 {
		return nil
	}
	_, err := c.Conn.Write(b)
	*c.buf = b[:0]
	return err
}

// batchTLS is an HBONE connection's TLS: large Writes are gathered by its
// batchConn. It embeds *tls.Conn for reads, the handshake and
// ConnectionState.
type batchTLS struct {
	*tls.Conn
	raw    *batchConn
	client bool
	keys   *keyCapture // non-nil: the record layer takes over (afterHandshake)
}

// ownRecords turns the record layer (record.go) on; benchmarks and tests
// turn it off to compare with crypto/tls's.
var ownRecords = true

func newBatchTLS(raw net.Conn, client bool, cfg *tls.Config) *batchTLS {
	bc := &batchConn{Conn: newRawNetConn(raw)}
	var keys *keyCapture
	if ownRecords {
		keys = &keyCapture{}
		cfg = captureKeys(cfg, keys, !client)
		bc.bounded = true
	}
	var tc *tls.Conn
	if client {
		tc = tls.Client(bc, cfg)
	} else {
		tc = tls.Server(bc, cfg)
	}
	return &batchTLS{Conn: tc, raw: bc, client: client, keys: keys}
}

// afterHandshake returns what the connection reads and writes once the
// handshake succeeded: the record layer when it can take over (TLS 1.3
// with an AES-GCM suite, crypto/tls stopped between records), else the
// tls.Conn itself, which can always carry on.
func (c *batchTLS) afterHandshake() wire {
	c.raw.bounded = false
	if c.keys == nil || !c.raw.atRecordEnd() {
		return c
	}
	var rio *rawIO
	if r, ok := c.raw.Conn.(*rawNetConn); ok {
		rio = r.io
	}
	rc, err := newRecordConn(c.raw.Conn, rio, c.client, c.ConnectionState(), c.keys)
	if err != nil {
		return c
	}
	return rc
}

// batchWrites turns gathering on; benchmarks turn it off to measure it.
var batchWrites = true

// closeNow closes the socket under the TLS connection at once.
func (c *batchTLS) closeNow() error { return c.raw.Conn.Close() }

func (c *batchTLS) roomNow() bool {
	if r, ok := c.raw.Conn.(*rawNetConn); ok {
		return r.io.roomNow()
	}
	return false
}

func (c *batchTLS) Write(p []byte) (int, error) {
	if len(p) < batchMinWrite || !batchWrites {
		return c.Conn.Write(p)
	}
	c.raw.begin()
	n, err := c.Conn.Write(p)
	if ferr := c.raw.end(); err == nil && ferr != nil {
		// The records are encrypted and counted as written, but did not
		// reach the socket: the connection is broken either way.
		err = ferr
	}
	return n, err
}
