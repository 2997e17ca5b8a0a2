package hbone

import (
	"fmt"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The write side of a conn: frames go out through flat combining (the
// caller that finds no write in progress writes; others append to wbuf
// for it), and the reader's control frames are written inline only when
// that cannot wait on the socket.

// writeBufs holds the write buffers of connections that are not
// writing. A buffer that a burst grew past maxWriteBuf is dropped.
var writeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2*maxPending+frameHeaderLen); return &b }}

const maxWriteBuf = 4 * maxPending

// appendMax is the largest frame appended behind a write in progress.
// Larger frames (bulk streams' DATA, up to maxReadSize) wait for their
// turn instead: appending them copied every byte of concurrent bulk
// streams once more and grew wbuf past maxWriteBuf on every turn, so it
// was dropped and reallocated (8 streams in the bench: ~245 MB/s of
// garbage on the sending ztunnel, a GC every 30 ms). A frame of one TLS
// record still coalesces with others into one write.
const appendMax = 16<<10 + frameHeaderLen

// appendLocked adds p to the pending frames, taking a buffer from the pool
// if the connection holds none. Called with wmu held.
func (c *conn) appendLocked(p []byte) {
	if c.wbuf == nil {
		c.wbuf = writeBufs.Get().(*[]byte)
	}
	*c.wbuf = append(*c.wbuf, p...)
}

// pendingLocked is how many bytes wait for the flusher.
func (c *conn) pendingLocked() int {
	if c.wbuf == nil {
		return 0
	}
	return len(*c.wbuf)
}

func putWriteBuf(b *[]byte) {
	if b != nil && cap(*b) <= maxWriteBuf {
		*b = (*b)[:0]
		writeBufs.Put(b)
	}
}

// pendingWriter appends the control frames the write Framer produces to
// wbuf; it is used only with wmu held.
type pendingWriter struct{ c *conn }

func (w pendingWriter) Write(p []byte) (int, error) {
	w.c.appendLocked(p)
	return len(p), nil
}

// writeFrame sends one complete frame (header and payload in buf). If no
// write is in progress it is written directly, without a copy; otherwise
// a small frame is appended for the goroutine writing now, and a large one
// waits for the write to end and is then written directly too.
func (c *conn) writeFrame(buf []byte) error {
	c.wmu.Lock()
	if len(buf) > appendMax {
		for c.werr == nil && c.flushing {
			c.turn.Wait()
		}
	}
	for c.werr == nil && c.flushing && c.pendingLocked() >= maxPending {
		c.wcond.Wait()
	}
	if c.werr != nil {
		err := c.werr
		c.wmu.Unlock()
		return err
	}
	if c.flushing {
		c.appendLocked(buf)
		c.wmu.Unlock()
		return nil
	}
	c.flushing = true
	c.wmu.Unlock()
	_, err := c.w.Write(buf)
	c.wmu.Lock()
	return c.flushLocked(err)
}

// writeControl appends frames with fill (called with wmu held) and makes
// sure they are written. From the reader goroutine (async) it never waits
// on the socket: a reader blocked on a full socket while its peer does the
// same would deadlock both. So when nobody is writing it writes the
// frames itself only if the socket has room for them now, and otherwise
// starts a goroutine to.
func (c *conn) writeControl(async bool, fill func()) error {
	c.wmu.Lock()
	if c.werr != nil {
		err := c.werr
		c.wmu.Unlock()
		return err
	}
	fill()
	return c.kickLocked(async)
}

// kickLocked gets what was appended to wbuf written: by the goroutine
// already writing, by this one, or (async) by a new one — unless what is
// pending is a few control frames and the socket has room for them, the
// common case of a WINDOW_UPDATE from a reader receiving a bulk stream:
// starting a goroutine for it wakes a thread (with two Ps, a futex wake and
// context switches; writing inline took a receiving ztunnel from ~12 000
// to ~8 000 switches per GB in the bench). It is called with wmu held and
// returns with it released.
func (c *conn) kickLocked(async bool) error {
	if c.flushing {
		c.wmu.Unlock()
		return nil
	}
	c.flushing = true
	if async && (c.pendingLocked() > inlineControlMax || !c.w.roomNow()) {
		c.wmu.Unlock()
		go c.flushAsync()
		return nil
	}
	return c.flushTurnLocked(nil, async)
}

// inlineControlMax bounds what the reader writes itself (kickLocked):
// a few control frames, far below a TCP socket's free space when poll
// reports it writable (at least half of what it has queued), so the write
// cannot wait unless the host runs out of TCP memory in between.
const inlineControlMax = 256

func (c *conn) flushAsync() {
	c.wmu.Lock()
	_ = c.flushLocked(nil)
}

// flushLocked writes wbuf until it stays empty, then ends this
// goroutine's turn as the writer. It is called with wmu held and
// flushing set, and returns with wmu released.
func (c *conn) flushLocked(err error) error { return c.flushTurnLocked(err, false) }

// flushTurnLocked is flushLocked; once: this goroutine may not wait on
// the socket (the reader), so it writes wbuf once and hands what was
// appended meanwhile, which may be large, to a new goroutine.
func (c *conn) flushTurnLocked(err error, once bool) error {
	for wrote := false; err == nil && c.werr == nil && c.pendingLocked() > 0; wrote = true {
		if once && wrote {
			c.wmu.Unlock() // still flushing: the new goroutine goes on
			go c.flushAsync()
			return nil
		}
		buf := c.wbuf
		c.wbuf, c.spare = c.spare, nil
		c.wcond.Broadcast() // room in wbuf again
		c.wmu.Unlock()
		_, err = c.w.Write(*buf)
		c.wmu.Lock()
		*buf = (*buf)[:0]
		c.spare = buf
	}
	// Nothing pending: give the buffers back, so an idle connection holds
	// none (a burst of many streams can grow them to hundreds of KiB).
	putWriteBuf(c.spare)
	c.spare = nil
	if c.pendingLocked() == 0 {
		putWriteBuf(c.wbuf)
		c.wbuf = nil
	}
	if err != nil && c.werr == nil {
		c.werr = fmt.Errorf("hbone: write: %w", err)
	}
	c.flushing = false
	c.wcond.Broadcast()
	c.turn.Signal()
	werr := c.werr
	c.wmu.Unlock()
	if err != nil {
		c.close(werr)
	}
	return werr
}

// writeHeaders encodes fields as a HEADERS frame (and CONTINUATIONs when
// the block exceeds the peer's frame size). Called with wmu held.
func (c *conn) writeHeadersLocked(id uint32, endStream bool, fields []hpack.HeaderField) {
	c.hbuf.Reset()
	for _, f := range fields {
		_ = c.henc.WriteField(f)
	}
	block := c.hbuf.Bytes()
	c.mu.Lock()
	max := c.peerMaxFrame
	c.mu.Unlock()
	first := true
	for first || len(block) > 0 {
		chunk := block
		if len(chunk) > max {
			chunk = chunk[:max]
		}
		block = block[len(chunk):]
		if first {
			_ = c.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: chunk, EndStream: endStream, EndHeaders: len(block) == 0})
			first = false
		} else {
			_ = c.wfr.WriteContinuation(id, len(block) == 0, chunk)
		}
	}
}

// putDataHeader fills a DATA frame header into b[:9].
func putDataHeader(b []byte, n int, endStream bool, id uint32) {
	b[0], b[1], b[2] = byte(n>>16), byte(n>>8), byte(n)
	b[3] = byte(http2.FrameData)
	b[4] = 0
	if endStream {
		b[4] = byte(http2.FlagDataEndStream)
	}
	b[5], b[6], b[7], b[8] = byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id)
}
