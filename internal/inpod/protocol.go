package inpod

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// MaxMessageSize is the largest ZDS packet accepted. Upstream ztunnel and
// istio-cni both read into 1024-byte buffers, and the biggest legal request
// (uid, 253-byte name, 63-byte namespace, 253-byte service account) is far
// below it; anything larger arrives with MSG_TRUNC and is rejected.
const MaxMessageSize = 1024

// maxFDs is the room in the control buffer. One FD is legal; room for a few
// more means extra FDs are received and closed by us (and reported as
// too_many_fds) instead of being dropped by the kernel under MSG_CTRUNC.
const maxFDs = 8

// Kind is the payload of a WorkloadRequest.
type Kind int

// Request kinds, in the order the protocol uses them.
const (
	KindAdd Kind = iota + 1
	KindKeep
	KindDel
	KindSnapshotSent
)

func (k Kind) String() string {
	switch k {
	case KindAdd:
		return "add"
	case KindKeep:
		return "keep"
	case KindDel:
		return "del"
	case KindSnapshotSent:
		return "snapshot_sent"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Request is one decoded WorkloadRequest.
type Request struct {
	Kind Kind
	UID  string
	// Info is set for Add (nil if the agent left it out).
	Info *zdspb.WorkloadInfo
	// FD is the netns FD that came with Add, owned by the receiver, which
	// must close it; -1 for every other kind.
	FD int
}

// ReadRequest reads one packet from the agent. A *Error means the packet was
// bad but the stream is intact (SEQPACKET keeps message boundaries): Ack the
// error and read on. Any other error means the connection is unusable (an
// orderly close is io.EOF, wrapped). FDs that arrive are closed unless
// returned in Request.FD.
func ReadRequest(c *net.UnixConn) (Request, error) {
	var buf [MaxMessageSize]byte
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf[:], oob)
	fds, ferr := parseRights(oob[:oobn])
	if err != nil {
		closeFDs(fds)
		return Request{FD: -1}, fmt.Errorf("inpod: read request: %w", err)
	}
	if ferr != nil {
		closeFDs(fds)
		return Request{FD: -1}, &Error{Reason: ReasonBadControl, Err: ferr}
	}
	return decodeRequest(buf[:n], flags, fds)
}

// decodeRequest turns one packet into a Request. It takes ownership of fds:
// every one is closed except the FD of a valid Add. All checks that can fail
// run before an FD is handed out, so nothing leaks on any path.
func decodeRequest(data []byte, flags int, fds []int) (Request, error) {
	fail := func(e *Error) (Request, error) {
		closeFDs(fds)
		return Request{FD: -1}, e
	}
	if flags&unix.MSG_TRUNC != 0 {
		return fail(reject(ReasonTruncated, "", "message larger than %d bytes", MaxMessageSize))
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return fail(reject(ReasonTruncated, "", "control data truncated"))
	}
	var req zdspb.WorkloadRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return fail(&Error{Reason: ReasonDecode, Err: err})
	}
	var out Request
	switch p := req.GetPayload().(type) {
	case *zdspb.WorkloadRequest_Add:
		out = Request{Kind: KindAdd, UID: p.Add.GetUid(), Info: p.Add.GetWorkloadInfo()}
	case *zdspb.WorkloadRequest_Keep:
		out = Request{Kind: KindKeep, UID: p.Keep.GetUid()}
	case *zdspb.WorkloadRequest_Del:
		out = Request{Kind: KindDel, UID: p.Del.GetUid()}
	case *zdspb.WorkloadRequest_SnapshotSent:
		out = Request{Kind: KindSnapshotSent}
	default:
		return fail(reject(ReasonUnknownPayload, "", "no payload this version understands (%d bytes)", len(data)))
	}
	switch {
	case out.Kind == KindAdd && len(fds) == 0:
		return fail(reject(ReasonMissingFD, out.UID, "add without a netns fd"))
	case out.Kind == KindAdd && len(fds) > 1:
		return fail(reject(ReasonTooManyFDs, out.UID, "expected 1 fd, got %d", len(fds)))
	case out.Kind != KindAdd && len(fds) > 0:
		return fail(reject(ReasonUnexpectedFD, out.UID, "%d fd(s) with %s", len(fds), out.Kind))
	}
	out.FD = -1
	if out.Kind == KindAdd {
		out.FD = fds[0]
	}
	return out, nil
}

// parseRights returns every FD carried in SCM_RIGHTS messages of oob, even
// when a later message is malformed (so the caller can close them).
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	var errs []error
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			errs = append(errs, fmt.Errorf("unexpected control message level %d type %d", m.Header.Level, m.Header.Type))
			continue
		}
		got, err := unix.ParseUnixRights(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("parse SCM_RIGHTS: %w", err))
			continue
		}
		fds = append(fds, got...)
	}
	return fds, errors.Join(errs...)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// WriteMsg sends m as one packet, with fds (if any) in SCM_RIGHTS. The
// caller keeps ownership of fds.
func WriteMsg(c *net.UnixConn, m proto.Message, fds ...int) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("inpod: encode %T: %w", m, err)
	}
	return WriteRaw(c, data, fds...)
}

// WriteRaw sends data as one packet, with fds (if any) in SCM_RIGHTS.
func WriteRaw(c *net.UnixConn, data []byte, fds ...int) error {
	if len(data) > MaxMessageSize {
		return fmt.Errorf("inpod: write: message of %d bytes exceeds %d", len(data), MaxMessageSize)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(data, oob, nil)
	if err != nil {
		return fmt.Errorf("inpod: write: %w", err)
	}
	if n != len(data) {
		return fmt.Errorf("inpod: write: short write %d of %d bytes", n, len(data))
	}
	return nil
}

// ReadMsg reads one packet into m (a ZdsHello or WorkloadResponse, on the
// agent side). FDs are never expected here and are closed.
func ReadMsg(c *net.UnixConn, m proto.Message) error {
	var buf [MaxMessageSize]byte
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf[:], oob)
	fds, _ := parseRights(oob[:oobn])
	closeFDs(fds)
	if err != nil {
		return fmt.Errorf("inpod: read: %w", err)
	}
	if len(fds) > 0 {
		return reject(ReasonUnexpectedFD, "", "%d fd(s) with %T", len(fds), m)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return reject(ReasonTruncated, "", "message larger than %d bytes", MaxMessageSize)
	}
	if err := proto.Unmarshal(buf[:n], m); err != nil {
		return &Error{Reason: ReasonDecode, Err: err}
	}
	return nil
}
