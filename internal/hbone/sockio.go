package hbone

import (
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// Buffers. Every buffer has frameHeaderLen bytes of room in front of its
// payload size, so bytes read from a socket become a DATA frame in place.
// Buffers live in size-class pools and are held only while bytes are in
// flight: an idle stream owns none.
var bufClasses = [...]int{4 << 10, 16 << 10, 64 << 10, 256 << 10}

// maxReadSize is the largest payload read from a socket at once; frames
// are cut to the peer's frame size from it.
const maxReadSize = 256 << 10

var bufPools [len(bufClasses)]sync.Pool

func init() {
	for i, size := range bufClasses {
		n := size + frameHeaderLen
		bufPools[i].New = func() any { b := make([]byte, n); return &b }
	}
}

// getBuf returns a buffer of at least n bytes (len = cap = class size).
func getBuf(n int) *[]byte {
	for i, size := range bufClasses {
		if n <= size+frameHeaderLen {
			return bufPools[i].Get().(*[]byte)
		}
	}
	b := make([]byte, n)
	return &b
}

func putBuf(b *[]byte) {
	c := cap(*b)
	for i, size := range bufClasses {
		if c == size+frameHeaderLen {
			*b = (*b)[:c]
			bufPools[i].Put(b)
			return
		}
	}
}

// directIO enables the socket fast paths (reads that hold no buffer while
// idle, writes from the connection's reader goroutine). Benchmarks turn it
// off to measure them.
var directIO = true

// source reads a stream's outgoing bytes from an io.Reader. On a socket it
// reads through the raw descriptor: the buffer is taken from the pool
// only when the socket has bytes, so a goroutine parked on an idle
// connection holds none. Read sizes start at one TLS record and grow for
// bulk transfers.
type source struct {
	r      io.Reader
	rc     syscall.RawConn // nil: plain Read
	size   int             // payload to ask for next
	full   int             // consecutive reads that filled the buffer
	readFn func(uintptr) bool

	// The read callback's arguments and results (see rawIO).
	buf   *[]byte
	n     int
	errno syscall.Errno
	want  int
}

// fullReadsToGrow: one full read happens to chatty protocols too; several
// in a row mean bulk.
const fullReadsToGrow = 4

func newSource(r io.Reader) *source {
	s := &source{r: r, size: 16 << 10, rc: rawConn(r)}
	s.readFn = s.doRead
	return s
}

// doRead takes a buffer only once the socket has bytes for it.
func (s *source) doRead(fd uintptr) bool {
	if s.buf == nil {
		s.buf = getBuf(frameHeaderLen + s.want)
	}
	s.n, s.errno = rawRead(fd, (*s.buf)[frameHeaderLen:frameHeaderLen+s.want])
	if s.errno == syscall.EAGAIN {
		putBuf(s.buf)
		s.buf = nil
		return false // wait for the poller
	}
	return true
}

// read returns a buffer holding n payload bytes at
// [frameHeaderLen:frameHeaderLen+n] (nil when nothing was read), and
// io.EOF at the end.
func (s *source) read(limit int) (b *[]byte, n int, err error) {
	size := min(s.size, limit)
	if s.rc == nil {
		b = getBuf(frameHeaderLen + size)
		n, err = s.r.Read((*b)[frameHeaderLen : frameHeaderLen+size])
	} else {
		s.want, s.n, s.errno = size, 0, 0
		err = s.rc.Read(s.readFn)
		b, n = s.buf, s.n
		s.buf = nil
		if err == nil && s.errno != 0 {
			err = os.NewSyscallError("read", s.errno)
		}
		if err == nil && n == 0 {
			err = io.EOF
		}
	}
	if n == size {
		if s.full++; s.full >= fullReadsToGrow && s.size < maxReadSize {
			s.size *= 4
			s.full = 0
		}
	} else {
		s.full = 0
	}
	if n == 0 && b != nil {
		putBuf(b)
		b = nil
	}
	return b, n, err
}

// sink is where CopyTo delivers a stream's bytes.
type sink struct {
	w     io.Writer
	rc    syscall.RawConn // non-nil: the reader goroutine may write directly
	io    *rawIO          // on rc
	n     *atomic.Int64   // caller's live counter; may be nil
	total atomic.Int64
	done  func(error) // StartCopyTo's completion; nil for CopyTo
	// bounded: TCP_NOTSENT_LOWAT is set. Only tryWrite (the connection's
	// reader) touches it.
	bounded bool
}

func newSink(w io.Writer, n *atomic.Int64) *sink {
	k := &sink{w: w, n: n, rc: rawConn(w)}
	if k.rc != nil {
		k.io = newRawIO(k.rc)
	}
	return k
}

func (k *sink) count(n int) {
	if n <= 0 {
		return
	}
	k.total.Add(int64(n))
	if k.n != nil {
		k.n.Add(int64(n))
	}
}

// tryWrite writes what the socket takes without blocking. A short count
// with a nil error means the socket is full; the first time, its unsent
// bytes are bounded from then on (see notSentLowat).
func (k *sink) tryWrite(p []byte) (int, error) {
	n, err := k.io.write(p, false)
	k.count(n)
	if err == nil && n < len(p) && !k.bounded {
		k.bounded = true
		boundUnsent(k.rc)
	}
	return n, err
}

// write writes all of p, waiting when the socket is full (the backlog
// path of CopyTo). It never runs concurrently with tryWrite.
func (k *sink) write(p []byte) (int, error) {
	if k.rc == nil {
		return k.w.Write(p)
	}
	return k.io.write(p, true)
}
