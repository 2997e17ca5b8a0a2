package hbone

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
)

// recordConn is an HBONE connection's TLS 1.3 record layer after the
// handshake (RFC 8446 section 5), in place of tls.Conn's Read and Write.
// crypto/tls seals each record into its own buffer, which batchConn then
// copies into a gather buffer, and it opens records one socket read of
// ~23 KB at a time, copying each into the caller's buffer. Here a Write
// seals every record from the caller's bytes straight into the gather
// buffer, and a Read takes all the socket has (up to recordBufSize) and
// opens each record straight into the caller's buffer when it fits: one
// copy less on each side, and the receiving ztunnel makes half the
// read/write syscalls per GB (bench/README.md has the measurements).
//
// What arrives besides application data: close_notify ends the stream
// (io.EOF), other alerts are errors, NewSessionTicket is ignored, KeyUpdate
// moves the read keys on and, when the peer asks, ours too before our next
// record. We send a KeyUpdate ourselves every keyUpdateRecords records, far
// inside AES-GCM's limit of 2^24.5 records per key (RFC 8446 section 5.5).
type recordConn struct {
	raw net.Conn
	rc  syscall.RawConn // nil when raw is not a socket (tests)
	io  *rawIO          // writes and roomNow on rc

	// The read side belongs to the goroutine that calls Read.
	in      *trafficKeys
	rbuf    *[]byte // pooled ciphertext, nil while none is buffered
	rlo     int     // unread ciphertext is (*rbuf)[rlo:rhi]
	rhi     int
	peek    [recordHeaderLen]byte // fill's first read when raw is not a socket
	plain   []byte                // application data opened in place, not yet returned
	hs      []byte                // post-handshake message split across records
	useless int                   // records in a row that carried no application data
	rerr    error
	readFn  func(uintptr) bool
	rn      int
	rerrno  syscall.Errno

	wmu        sync.Mutex
	out        *trafficKeys // guarded by wmu
	werr       error        // guarded by wmu
	peerAsked  atomic.Bool  // the peer asked for our KeyUpdate
	sentUpdate atomic.Int64 // KeyUpdates sent (tests)
}

const (
	recordHeaderLen  = 5
	recordTagLen     = 16
	maxPlaintext     = 16 << 10
	maxInnerLen      = maxPlaintext + 1   // content and its type byte
	maxCiphertextLen = maxPlaintext + 256 // RFC 8446 section 5.2
	maxRecordLen     = recordHeaderLen + maxCiphertextLen
	recordOverhead   = recordHeaderLen + 1 + recordTagLen
	maxHandshakeMsg  = 64 << 10 // a post-handshake message (a ticket) this long is refused
	maxUselessRecord = 100      // as crypto/tls: empty records or tickets in a row

	recordTypeAlert     = 21
	recordTypeHandshake = 22
	recordTypeAppData   = 23
	msgNewSessionTicket = 4
	msgKeyUpdate        = 24
	alertCloseNotify    = 0
	alertUserCanceled   = 90

	// recordBufSize is how much ciphertext one read takes: 128 KiB is
	// eight full records per syscall, plus room to keep a partial one.
	recordBufSize = 128<<10 + maxRecordLen
	// keyUpdateLen is a sealed KeyUpdate record.
	keyUpdateLen = recordOverhead + 5
	// sealBufSize is a Write's gather buffer: a maximum-size DATA frame
	// with its header in records, and a KeyUpdate, so the frame takes
	// one write syscall.
	sealBufSize = ((maxFrameSize+frameHeaderLen)/maxPlaintext+1)*(maxPlaintext+recordOverhead) + keyUpdateLen
)

// keyUpdateRecords is how many records we seal under one key before a
// KeyUpdate; a variable so tests can make it small.
var keyUpdateRecords uint64 = 1 << 23

var (
	recordBufs = sync.Pool{New: func() any { b := make([]byte, recordBufSize); return &b }}
	sealBufs   = sync.Pool{New: func() any { b := make([]byte, 0, sealBufSize); return &b }}
)

var (
	errRecordMAC      = errors.New("hbone: tls: record failed authentication")
	errRecordTooLarge = errors.New("hbone: tls: record too large")
	errRecordType     = errors.New("hbone: tls: unexpected record")
	errTooManyEmpty   = errors.New("hbone: tls: too many records without data")
)

// newRecordConn takes over raw after crypto/tls's handshake, with the
// traffic secrets it logged. rio is the raw I/O crypto/tls used, or nil.
func newRecordConn(raw net.Conn, rio *rawIO, client bool, st tls.ConnectionState, k *keyCapture) (*recordConn, error) {
	if st.Version != tls.VersionTLS13 || k.client == nil || k.server == nil {
		return nil, errors.New("hbone: record layer: no TLS 1.3 traffic secrets")
	}
	readSecret, writeSecret := k.server, k.client
	if !client {
		readSecret, writeSecret = k.client, k.server
	}
	in, err := newTrafficKeys(st.CipherSuite, readSecret)
	if err != nil {
		return nil, err
	}
	out, err := newTrafficKeys(st.CipherSuite, writeSecret)
	if err != nil {
		return nil, err
	}
	c := &recordConn{raw: raw, in: in, out: out}
	if rio != nil {
		c.rc, c.io = rio.rc, rio
	}
	c.readFn = c.doRead
	return c, nil
}

func (c *recordConn) LocalAddr() net.Addr  { return c.raw.LocalAddr() }
func (c *recordConn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }
func (c *recordConn) closeNow() error      { return c.raw.Close() }

func (c *recordConn) roomNow() bool {
	return c.io != nil && c.io.roomNow()
}

// Read returns application data, opening as many whole records straight
// into p as fit.
func (c *recordConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if len(c.plain) > 0 {
			n := copy(p, c.plain)
			c.plain = c.plain[n:]
			c.releaseRead()
			return n, nil
		}
		if n := c.open(p); n > 0 {
			c.releaseRead()
			return n, nil
		}
		if len(c.plain) > 0 {
			continue
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		c.fill()
	}
}

// open opens the whole records buffered, straight into p while each fits
// in what is left of it, or the first one in place (c.plain) when it does
// not. It returns how much application data it put in p and stops at an
// error (c.rerr).
func (c *recordConn) open(p []byte) int {
	n := 0
	for c.rerr == nil && c.rbuf != nil {
		b := (*c.rbuf)[c.rlo:c.rhi]
		if len(b) < recordHeaderLen {
			break
		}
		if b[0] != recordTypeAppData {
			c.rerr = fmt.Errorf("%w: type %d after the handshake", errRecordType, b[0])
			break
		}
		l := int(b[3])<<8 | int(b[4])
		if l > maxCiphertextLen || l < recordTagLen+1 {
			c.rerr = fmt.Errorf("%w: %d bytes", errRecordTooLarge, l)
			break
		}
		if len(b) < recordHeaderLen+l {
			break
		}
		hdr, ct := b[:recordHeaderLen], b[recordHeaderLen:recordHeaderLen+l]
		direct := len(p)-n >= l-recordTagLen
		var dst []byte
		switch {
		case direct:
			dst = p[n:n]
		case n > 0:
			return n // the next Read opens it
		default:
			dst = ct[:0]
		}
		inner, err := c.in.aead.Open(dst, c.in.nextNonce(), ct, hdr)
		if err != nil {
			c.rerr = errRecordMAC
			break
		}
		c.rlo += recordHeaderLen + l
		typ, content, err := innerContent(inner)
		if err != nil {
			c.rerr = err
			break
		}
		if typ == recordTypeAppData && len(content) > 0 {
			c.useless = 0
			if !direct {
				c.plain = content
				return 0
			}
			n += len(content)
			continue
		}
		if c.useless++; c.useless > maxUselessRecord {
			c.rerr = errTooManyEmpty
			break
		}
		switch typ {
		case recordTypeAppData: // empty
		case recordTypeAlert:
			c.rerr = alertErr(content)
		case recordTypeHandshake:
			c.rerr = c.onHandshake(content)
		default:
			c.rerr = fmt.Errorf("%w: inner type %d", errRecordType, typ)
		}
	}
	return n
}

// innerContent splits a TLSInnerPlaintext into its content type and
// content, dropping the zero padding.
func innerContent(inner []byte) (byte, []byte, error) {
	if len(inner) > maxInnerLen {
		return 0, nil, fmt.Errorf("%w: %d bytes of plaintext", errRecordTooLarge, len(inner))
	}
	i := len(inner) - 1
	for i >= 0 && inner[i] == 0 {
		i--
	}
	if i < 0 {
		return 0, nil, fmt.Errorf("%w: no content type", errRecordType)
	}
	return inner[i], inner[:i], nil
}

// recordErrorType names, for the error counters, a read error of the
// record layer: "tls_record" for what broke TLS 1.3's rules or failed
// authentication (garbage or tampering on the wire), "tls_alert" for an
// alert from the peer; "" for anything else.
func recordErrorType(err error) string {
	var alert tls.AlertError
	switch {
	case errors.Is(err, errRecordMAC), errors.Is(err, errRecordTooLarge),
		errors.Is(err, errRecordType), errors.Is(err, errTooManyEmpty):
		return "tls_record"
	case errors.As(err, &alert):
		return "tls_alert"
	}
	return ""
}

func alertErr(content []byte) error {
	if len(content) != 2 {
		return fmt.Errorf("%w: alert of %d bytes", errRecordType, len(content))
	}
	switch content[1] {
	case alertCloseNotify:
		return io.EOF
	case alertUserCanceled:
		return nil // a close_notify follows
	}
	return fmt.Errorf("hbone: tls: peer sent alert: %w", tls.AlertError(content[1]))
}

// onHandshake takes the post-handshake messages in a record's content.
func (c *recordConn) onHandshake(content []byte) error {
	c.hs = append(c.hs, content...)
	for len(c.hs) >= 4 {
		l := int(c.hs[1])<<16 | int(c.hs[2])<<8 | int(c.hs[3])
		if l > maxHandshakeMsg {
			return fmt.Errorf("%w: handshake message of %d bytes", errRecordTooLarge, l)
		}
		if len(c.hs) < 4+l {
			return nil
		}
		typ, body := c.hs[0], c.hs[4:4+l]
		c.hs = c.hs[4+l:]
		switch typ {
		case msgNewSessionTicket: // we never resume
		case msgKeyUpdate:
			// The new keys start with the next record, so the message
			// must end this one (RFC 8446 section 5.1).
			if l != 1 || body[0] > 1 || len(c.hs) > 0 {
				return fmt.Errorf("%w: malformed KeyUpdate", errRecordType)
			}
			if err := c.in.update(); err != nil {
				return err
			}
			if body[0] == 1 {
				c.peerAsked.Store(true)
			}
		default:
			return fmt.Errorf("%w: handshake message %d after the handshake", errRecordType, typ)
		}
	}
	if len(c.hs) == 0 {
		c.hs = nil
	}
	return nil
}

// releaseRead returns the read buffer to the pool once it holds nothing,
// so an idle connection keeps none.
func (c *recordConn) releaseRead() {
	if c.rbuf != nil && c.rlo == c.rhi && len(c.plain) == 0 {
		recordBufs.Put(c.rbuf)
		c.rbuf, c.rlo, c.rhi = nil, 0, 0
	}
}

// makeRoom takes a buffer if there is none and moves a partial record to
// its front when a whole one would not fit behind it.
func (c *recordConn) makeRoom() []byte {
	if c.rbuf == nil {
		c.rbuf = recordBufs.Get().(*[]byte)
	}
	b := *c.rbuf
	if len(b)-c.rhi < maxRecordLen {
		c.rhi = copy(b, b[c.rlo:c.rhi])
		c.rlo = 0
	}
	return b[c.rhi:]
}

// fill reads more ciphertext, setting c.rerr when the connection ends.
func (c *recordConn) fill() {
	var n int
	var err error
	switch {
	case c.rc == nil && c.rbuf == nil:
		// Wait for the next record's first bytes without a buffer, so
		// that an idle connection holds none here too.
		if n, err = c.raw.Read(c.peek[:]); n > 0 {
			copy(c.makeRoom(), c.peek[:n])
		}
	case c.rc == nil:
		n, err = c.raw.Read(c.makeRoom())
	default:
		c.rn, c.rerrno = 0, 0
		if err = c.rc.Read(c.readFn); err == nil && c.rerrno != 0 {
			err = os.NewSyscallError("read", c.rerrno)
		}
		n = c.rn
		if err == nil && n == 0 {
			err = io.EOF
		}
		if err != nil && err != io.EOF {
			err = opError("read", c.raw, err)
		}
	}
	c.rhi += n
	if n > 0 {
		return
	}
	if err == io.EOF && c.rlo != c.rhi {
		err = io.ErrUnexpectedEOF // inside a record
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	c.rerr = err
	if c.rbuf != nil { // what is left is part of a record that will not come
		recordBufs.Put(c.rbuf)
		c.rbuf, c.rlo, c.rhi = nil, 0, 0
	}
}

// doRead is the callback of fill's RawConn.Read. It reads into a pooled
// buffer and, when the socket has nothing (EAGAIN) and nothing is
// buffered, gives the buffer back before the poller parks the goroutine,
// so a connection waiting for data holds none.
func (c *recordConn) doRead(fd uintptr) bool {
	n, e := rawRead(fd, c.makeRoom())
	if e == syscall.EAGAIN {
		c.releaseRead()
		return false
	}
	c.rn, c.rerrno = n, e
	return true
}

// Write seals p into records in one gather buffer and writes it with one
// syscall per sealBufSize.
func (c *recordConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return 0, c.werr
	}
	bp := sealBufs.Get().(*[]byte)
	defer func() {
		*bp = (*bp)[:0]
		sealBufs.Put(bp)
	}()
	b := *bp
	var err error
	if c.peerAsked.Swap(false) {
		// Answer before the next record (RFC 8446 section 4.6.3).
		if b, err = c.sealKeyUpdate(b, false); err != nil {
			c.werr = err
			return 0, err
		}
	}
	written := 0
	for len(p) > 0 {
		chunk := min(len(p), maxPlaintext)
		if cap(b)-len(b) < chunk+recordOverhead+keyUpdateLen {
			if err = c.flush(b); err != nil {
				break
			}
			b = b[:0]
		}
		if chunk < len(p) {
			b = c.sealBorrowing(b, p[:chunk+1])
		} else {
			b = c.seal(b, recordTypeAppData, p[:chunk])
		}
		p = p[chunk:]
		written += chunk
		if c.out.seq >= keyUpdateRecords {
			if b, err = c.sealKeyUpdate(b, false); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = c.flush(b)
	}
	if err != nil {
		// Sealed records that did not reach the socket cannot be sent
		// again: the connection is broken.
		c.werr = err
		return written, err
	}
	return written, nil
}

// seal appends one record of typ carrying data.
func (c *recordConn) seal(b []byte, typ byte, data []byte) []byte {
	off := len(b)
	l := len(data) + 1 + recordTagLen
	b = slices.Grow(b, recordHeaderLen+l) // Seal must find room for the tag
	b = append(b, recordTypeAppData, 3, 3, byte(l>>8), byte(l))
	b = append(b, data...)
	b = append(b, typ)
	body := b[off+recordHeaderLen:]
	c.out.aead.Seal(body[:0], c.out.nextNonce(), body, b[off:off+recordHeaderLen])
	return b[:off+recordHeaderLen+l]
}

// sealBorrowing appends one application data record carrying all of run
// but its last byte, which it borrows for the record's type byte and puts
// back: AES-GCM seals the content and its type as one run, and borrowing
// the byte that follows lets it read the content where it is instead of
// from a copy (see wire.Write). b has room for the record.
func (c *recordConn) sealBorrowing(b []byte, run []byte) []byte {
	off := len(b)
	l := len(run) + recordTagLen
	b = append(b, recordTypeAppData, 3, 3, byte(l>>8), byte(l))
	last := len(run) - 1
	saved := run[last]
	run[last] = recordTypeAppData
	b = c.out.aead.Seal(b, c.out.nextNonce(), run, b[off:off+recordHeaderLen])
	run[last] = saved
	return b
}

// sealKeyUpdate appends a KeyUpdate and moves the write keys on.
func (c *recordConn) sealKeyUpdate(b []byte, request bool) ([]byte, error) {
	msg := [5]byte{msgKeyUpdate, 0, 0, 1, 0}
	if request {
		msg[4] = 1
	}
	b = c.seal(b, recordTypeHandshake, msg[:])
	if err := c.out.update(); err != nil {
		return b, err
	}
	c.sentUpdate.Add(1)
	return b, nil
}

func (c *recordConn) flush(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if c.io == nil {
		_, err := c.raw.Write(b)
		return err
	}
	if _, err := c.io.write(b, true); err != nil {
		return opError("write", c.raw, err)
	}
	return nil
}
