package hbone

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/net/http2"
)

// readLoop reads and dispatches frames until the connection ends; it is
// the connection's only reader and closes the connection on return.
func (c *conn) readLoop() {
	for {
		f, err := c.readFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.countError("stream_" + se.Code.String())
				c.onStreamError(se.StreamID, se.Code)
				continue
			}
			var ce http2.ConnectionError
			var own connError
			switch {
			case errors.As(err, &own):
				c.fatal(own.code, err)
			case errors.As(err, &ce):
				c.fatal(http2.ErrCode(ce), fmt.Errorf("hbone: read frame: %w (%v)", err, c.rfr.ErrorDetail()))
			case errors.Is(err, http2.ErrFrameTooLarge):
				c.fatal(http2.ErrCodeFrameSize, fmt.Errorf("hbone: read frame: %w", err))
			case errors.Is(err, io.EOF):
				c.logPeerClose()
				c.close(errConnClosed)
			default:
				if typ := recordErrorType(err); typ != "" {
					c.countError(typ)
				}
				c.close(fmt.Errorf("hbone: read: %w", err))
			}
			return
		}
		c.readCount.Add(1)
		if f == nil {
			continue // a DATA frame, handled by readFrame
		}
		if err := c.dispatch(f); err != nil {
			var ce connError
			if errors.As(err, &ce) {
				c.fatal(ce.code, err)
			} else {
				c.close(err)
			}
			return
		}
	}
}

// logPeerClose says, when the peer closes the connection under streams
// still open (they fail), what it said before: a GOAWAY or nothing.
func (c *conn) logPeerClose() {
	c.mu.Lock()
	open, goAway, lastID := len(c.streams), c.goAwayRecv, c.goAwayID
	c.mu.Unlock()
	if open == 0 {
		return
	}
	c.log.Warn("hbone: peer closed the connection with streams open", "remote", c.remoteAddr().String(),
		"streams", open, "goAway", goAway, "goAwayLastStream", lastID, "framesRead", c.readCount.Load())
}

// readFrame reads the next frame. DATA frames are read here into a pooled
// buffer and handed to their stream (f is nil then): through the Framer
// they would land in its read buffer, which grows to the largest frame
// ever read and stays that large for the life of the connection, so an
// idle pooled connection that once carried bulk traffic would keep it.
// Every other frame goes through the Framer (validation, header blocks).
func (c *conn) readFrame() (http2.Frame, error) {
	fh, err := c.rfr.ReadFrameHeader()
	if err != nil {
		return nil, err
	}
	if fh.Type != http2.FrameData {
		return c.rfr.ReadFrameForHeader(fh)
	}
	if fh.Length > maxFrameSize {
		return nil, http2.ErrFrameTooLarge
	}
	if fh.StreamID == 0 {
		return nil, connError{http2.ErrCodeProtocol, "DATA frame on stream 0"}
	}
	b := getBuf(int(fh.Length))
	defer putBuf(b)
	p := (*b)[:fh.Length]
	if _, err := io.ReadFull(c.br, p); err != nil {
		return nil, err
	}
	data := p
	if fh.Flags.Has(http2.FlagDataPadded) {
		if len(p) == 0 || int(p[0]) >= len(p) {
			return nil, connError{http2.ErrCodeProtocol, "DATA padding longer than the frame"}
		}
		data = p[1 : len(p)-int(p[0])]
	}
	if err := c.onDataFrame(fh.StreamID, data, int64(fh.Length), fh.Flags.Has(http2.FlagDataEndStream)); err != nil {
		return nil, err
	}
	return nil, nil
}

// connError is a protocol violation that ends the connection.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string { return "hbone: " + e.code.String() + ": " + e.reason }

// fatal sends GOAWAY with code and closes the connection.
func (c *conn) fatal(code http2.ErrCode, err error) {
	c.countError("conn_" + code.String())
	c.log.Debug("hbone: connection error", "remote", c.remoteAddr().String(), "code", code.String(), "error", err)
	c.mu.Lock()
	last := c.maxSeenID
	c.mu.Unlock()
	_ = c.writeControl(true, func() { _ = c.wfr.WriteGoAway(last, code, []byte(err.Error())) })
	c.closeGracefully(err)
}

func (c *conn) dispatch(f http2.Frame) error {
	if !c.client {
		c.mu.Lock()
		first := !c.gotSettings
		c.mu.Unlock()
		if _, ok := f.(*http2.SettingsFrame); first && !ok {
			return connError{http2.ErrCodeProtocol, "first frame is not SETTINGS"}
		}
	}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		if s := c.stream(f.StreamID); s != nil {
			s.onReset(f.ErrCode)
		} else if err := c.checkKnownID(f.StreamID); err != nil {
			return err
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			data := f.Data
			_ = c.writeControl(true, func() { _ = c.wfr.WritePing(true, data) })
		}
	case *http2.GoAwayFrame:
		c.onGoAway(f)
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE with push disabled"}
	default:
		// PRIORITY and unknown frame types are ignored (RFC 9113 §5.5).
	}
	return nil
}

// stream returns the open stream id, or nil.
func (c *conn) stream(id uint32) *h2stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

// checkKnownID rejects frames for streams that were never opened (idle
// streams): RFC 9113 §5.1 makes that a connection error.
func (c *conn) checkKnownID(id uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var opened bool
	if c.client {
		opened = id < c.nextIDLocked()
	} else {
		opened = id <= c.maxSeenID
	}
	if !opened {
		return connError{http2.ErrCodeProtocol, fmt.Sprintf("frame for idle stream %d", id)}
	}
	return nil
}

// nextIDLocked reads nextID under mu: stream opening updates it with
// both wmu and mu held, so either lock is enough to read it.
func (c *conn) nextIDLocked() uint32 { return c.nextID }

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var tableSize uint32
	var haveTable bool
	c.mu.Lock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitWin
			c.peerInitWin = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
				if st.sendWin > maxWindow {
					return connError{http2.ErrCodeFlowControl, "stream window above 2^31-1"}
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = int(s.Val)
		case http2.SettingMaxConcurrentStreams:
			c.peerStreams = s.Val
		case http2.SettingHeaderTableSize:
			tableSize, haveTable = s.Val, true
		}
		return nil
	})
	first := !c.gotSettings
	c.gotSettings = true
	c.sendCond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		var ce connError
		if errors.As(err, &ce) {
			return ce
		}
		var h2e http2.ConnectionError
		if errors.As(err, &h2e) {
			return connError{http2.ErrCode(h2e), "bad SETTINGS value"}
		}
		return connError{http2.ErrCodeProtocol, err.Error()}
	}
	_ = c.writeControl(true, func() {
		if haveTable {
			c.henc.SetMaxDynamicTableSizeLimit(tableSize)
		}
		_ = c.wfr.WriteSettingsAck()
	})
	if first {
		close(c.settingsc)
	}
	return nil
}

// maxWindow is the largest flow-control window HTTP/2 allows.
const maxWindow = 1<<31 - 1

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	c.mu.Lock()
	if f.StreamID == 0 {
		c.sendWin += inc
		over := c.sendWin > maxWindow
		c.sendCond.Broadcast()
		c.mu.Unlock()
		if over {
			return connError{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
		}
		return nil
	}
	s := c.streams[f.StreamID]
	over := false
	if s != nil {
		s.sendWin += inc
		over = s.sendWin > maxWindow
		c.sendCond.Broadcast()
	}
	c.mu.Unlock()
	if over {
		c.onStreamError(f.StreamID, http2.ErrCodeFlowControl)
	}
	return nil
}

func (c *conn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	c.goAwayRecv = true
	if c.client {
		c.goAwayID = f.LastStreamID
	}
	var refused []*h2stream
	if c.client {
		for id, s := range c.streams {
			if id > f.LastStreamID {
				refused = append(refused, s)
			}
		}
	}
	idle := len(c.streams) == len(refused)
	c.mu.Unlock()
	if f.ErrCode != http2.ErrCodeNo {
		c.countError("goaway_" + f.ErrCode.String())
		// The peer found this side at fault: its streams in flight fail,
		// and the reason is only here.
		c.log.Warn("hbone: peer closed the connection with an error", "remote", c.remoteAddr().String(),
			"code", f.ErrCode.String(), "lastStream", f.LastStreamID, "debug", string(f.DebugData()))
	}
	for _, s := range refused {
		s.fail(errStreamRefused)
	}
	if idle {
		go c.closeGracefully(errGoAway)
	}
}

// onStreamError resets stream id with code (a stream-level protocol
// error), keeping the connection.
func (c *conn) onStreamError(id uint32, code http2.ErrCode) {
	if s := c.stream(id); s != nil {
		s.resetWith(code, true, fmt.Errorf("hbone: stream error: %s", code))
		return
	}
	_ = c.writeControl(true, func() { _ = c.wfr.WriteRSTStream(id, code) })
}

func (c *conn) onDataFrame(id uint32, data []byte, flow int64, end bool) error {
	c.mu.Lock()
	if !c.client && !c.gotSettings {
		c.mu.Unlock()
		return connError{http2.ErrCodeProtocol, "first frame is not SETTINGS"}
	}
	if flow > c.recvWin {
		c.mu.Unlock()
		return connError{http2.ErrCodeFlowControl, "peer overran the connection window"}
	}
	c.recvWin -= flow
	s := c.streams[id]
	c.mu.Unlock()
	if s == nil {
		if err := c.checkKnownID(id); err != nil {
			return err
		}
		// A stream we already finished: give the window back, and tell
		// the peer to stop if it keeps sending.
		c.credit(nil, 0, flow, true)
		_ = c.writeControl(true, func() { _ = c.wfr.WriteRSTStream(id, http2.ErrCodeStreamClosed) })
		return nil
	}
	s.onData(data, flow, end)
	return nil
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if s := c.stream(id); s != nil {
		if c.client {
			s.onResponse(f)
		} else if f.StreamEnded() {
			s.onData(nil, 0, true) // trailers end the request
		}
		return nil
	}
	if c.client {
		return c.checkKnownID(id)
	}
	// Server: a new stream.
	c.mu.Lock()
	if id%2 == 0 || id <= c.maxSeenID {
		c.mu.Unlock()
		return connError{http2.ErrCodeProtocol, fmt.Sprintf("bad new stream id %d", id)}
	}
	c.maxSeenID = id
	refuse := c.goAwaySent || c.closed || uint32(len(c.streams)) >= c.maxStreams
	var s *h2stream
	if !refuse {
		s = newH2Stream(c, id, c.peerInitWin)
		c.streams[id] = s
	}
	c.mu.Unlock()
	if refuse {
		c.countError("refused_stream")
		_ = c.writeControl(true, func() { _ = c.wfr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
		return nil
	}
	if f.StreamEnded() {
		s.onData(nil, 0, true)
	}
	c.onStream(s, f)
	return nil
}

// onResponse handles the response HEADERS of a client stream: 1xx are
// skipped; the first final status completes Connect.
func (s *h2stream) onResponse(f *http2.MetaHeadersFrame) {
	if s.respDone() {
		// Trailers, or HEADERS after the response: only END_STREAM matters.
		if f.StreamEnded() {
			s.onData(nil, 0, true)
		}
		return
	}
	code, err := strconv.Atoi(f.PseudoValue("status"))
	if f.Truncated || err != nil || code < 100 || code > 999 {
		s.resetWith(http2.ErrCodeProtocol, true, fmt.Errorf("hbone: bad :status %q", f.PseudoValue("status")))
		return
	}
	if code < 200 {
		return
	}
	h := make(http.Header, len(f.RegularFields()))
	for _, hf := range f.RegularFields() {
		k := http.CanonicalHeaderKey(hf.Name)
		h[k] = append(h[k], hf.Value)
	}
	s.setResponse(code, h)
	if f.StreamEnded() {
		s.onData(nil, 0, true)
	}
}
